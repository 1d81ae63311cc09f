# bash completion for leasehold(1). Installed by the package as
# /usr/share/bash-completion/completions/leasehold. tests/package/docs_test.py checks that every
# subcommand and every flag of `leasehold SUBCOMMAND --help` is offered here.

_leasehold() {
  local cur prev words cword
  _init_completion -n = 2>/dev/null || {
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  }

  local subcommands="run elect leader status list release schema check"
  local common="--store --quiet -q --verbose -v --help -h"
  local tree="--ttl --long-ttl --renew-every --wait --kill-grace --contain --wait-children --exit-code --metrics-addr --metrics-textfile --log-format --on-risk"

  # After `--` comes the command: complete it as a command line of its own.
  local i sub=""
  for ((i = 1; i < cword; i++)); do
    if [[ "${words[i]}" == "--" ]]; then
      _command_offset $((i + 1)) 2>/dev/null
      return
    fi
    if [[ -z "$sub" && " $subcommands " == *" ${words[i]} "* ]]; then
      sub="${words[i]}"
    fi
  done

  case "$prev" in
    --contain) COMPREPLY=($(compgen -W "auto cgroup pidns group" -- "$cur")); return ;;
    --log-format) COMPREPLY=($(compgen -W "text json" -- "$cur")); return ;;
    --on-risk) COMPREPLY=($(compgen -W "wait term" -- "$cur")); return ;;
    --wait) COMPREPLY=($(compgen -W "0 10s 1m forever" -- "$cur")); return ;;
    --once-per) COMPREPLY=($(compgen -W "15m 1h 1d" -- "$cur")); return ;;
    --retry-failed) COMPREPLY=($(compgen -W "yes no" -- "$cur")); return ;;
    --exit-code) COMPREPLY=($(compgen -W "usage= unavailable= internal= held= permission= lost= done= unsafe= cannot-execute= not-found= interrupted=" -- "$cur")); compopt -o nospace 2>/dev/null; return ;;
    --slot-zone) COMPREPLY=($(cd /usr/share/zoneinfo 2>/dev/null && compgen -f -- "$cur")); return ;;
    --metrics-textfile) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --store) COMPREPLY=($(compgen -W "sqlite:// redis:// redis+unix:// postgres:// etcd:// etcds:// zk://" -- "$cur")); compopt -o nospace 2>/dev/null; return ;;
    --ttl|--renew-every|--kill-grace|--key|--holder|--id|--metrics-addr|--slot-offset|--slot-tolerance|--hold-at-least|--keep-history|--probes|--limit) return ;;
  esac

  local flags
  case "$sub" in
    "") flags="$common --version"; COMPREPLY=($(compgen -W "$subcommands $flags" -- "$cur")); return ;;
    run) flags="$common $tree --key --holder --limit --shared --once-per --slot-offset --slot-zone --slot-tolerance --retry-failed --keep-history --hold-at-least" ;;
    elect) flags="$common $tree --id --again" ;;
    leader) flags="$common --watch --json" ;;
    status) flags="$common --key --json" ;;
    list) flags="$common --json" ;;
    release) flags="$common --key --force --holder" ;;
    schema) flags="$common" ;;
    check) flags="$common --ttl --probes --json" ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$flags --" -- "$cur"))
  fi
}
complete -F _leasehold leasehold
