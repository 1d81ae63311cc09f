# fish completion for leasehold(1). Installed by the package as
# /usr/share/fish/vendor_completions.d/leasehold.fish. tests/package/docs_test.py checks that every
# subcommand and every flag of `leasehold SUBCOMMAND --help` is offered here, and runs `fish -n`
# on it where fish is installed.

set -l subcommands run elect leader status list release schema check
complete -c leasehold -f

# The subcommands, before one is given.
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a run -d 'Run COMMAND while holding KEY'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a elect -d 'Run COMMAND while leader of NAME'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a leader -d 'Print the leader of NAME'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a status -d 'Who holds KEY (exit 0 held, 1 free)'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a list -d 'The live leases under PREFIX'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a release -d 'Break-glass: delete KEY (with --force)'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a schema -d 'Print the SQL of the postgres table'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -a check -d 'The store doctor'
complete -c leasehold -n "not __fish_seen_subcommand_from $subcommands" -l version -d 'Print the version'

# Every subcommand.
complete -c leasehold -l store -r -a 'sqlite:// redis:// redis+unix:// postgres:// etcd:// etcds:// zk://' -d 'Store URL'
complete -c leasehold -s q -l quiet -d 'Print only errors, at risk and lost'
complete -c leasehold -s v -l verbose -d 'Also print the lifecycle'
complete -c leasehold -s h -l help -d 'Print the help'

# run and elect: the lease and the command's tree.
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l ttl -x -d 'How long the store keeps the lease'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l long-ttl -d 'Allow a --ttl above 1h'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l renew-every -x -d 'How often to renew'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l wait -x -a '0 10s 1m forever' -d 'How long to wait for the key'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l kill-grace -x -d 'SIGTERM to SIGKILL'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l contain -x -a 'auto cgroup pidns group' -d 'How the tree is contained'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l wait-children -d 'Hold until leftovers exit'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l exit-code -x -a 'usage= unavailable= internal= held= permission= lost= done= unsafe= cannot-execute= not-found= interrupted=' -d 'Move an exit code'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l metrics-addr -x -d 'Serve /metrics at HOST:PORT'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l metrics-textfile -r -F -d 'Write metrics for node_exporter'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l log-format -x -a 'text json' -d 'Event lines as text or JSON'
complete -c leasehold -n '__fish_seen_subcommand_from run elect' -l on-risk -x -a 'wait term' -d 'When renewals fail'

# run only.
complete -c leasehold -n '__fish_seen_subcommand_from run status release' -l key -x -d 'The key (one that starts with -)'
complete -c leasehold -n '__fish_seen_subcommand_from run release' -l holder -x -d 'Holder id'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l limit -x -d 'At most N runs at once'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l shared -d 'A shared (read) lease'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l once-per -x -a '15m 1h 1d' -d 'Once per slot of PERIOD'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l slot-offset -x -d 'Where the grid starts'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l slot-zone -x -d 'IANA time zone of the grid'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l slot-tolerance -x -d 'Early start counted into the next slot'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l retry-failed -x -a 'yes no' -d 'A failed run leaves its slot open'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l hold-at-least -x -d 'Keep the lease at least this long'
complete -c leasehold -n '__fish_seen_subcommand_from run' -l keep-history -x -d 'Keep the --once-per run history this long'

# elect, leader, status, list, release, check.
complete -c leasehold -n '__fish_seen_subcommand_from elect' -l id -x -d 'This candidate id'
complete -c leasehold -n '__fish_seen_subcommand_from elect' -l again -d 'Campaign again after the command ends'
complete -c leasehold -n '__fish_seen_subcommand_from leader' -l watch -d 'Print every change of leader'
complete -c leasehold -n '__fish_seen_subcommand_from leader status list check' -l json -d 'One JSON object'
complete -c leasehold -n '__fish_seen_subcommand_from release' -l force -d 'Delete the grant whoever holds it'
complete -c leasehold -n '__fish_seen_subcommand_from check' -l ttl -x -d 'The TTL to judge'
complete -c leasehold -n '__fish_seen_subcommand_from check' -l probes -x -d 'Round trips to time'
