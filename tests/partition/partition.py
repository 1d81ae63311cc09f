#!/usr/bin/env python3
"""Partitions of real 3-node etcd and ZooKeeper clusters (issue 21, part 3).

Builds a small network of its own out of Linux network namespaces, starts a 3-member cluster of
the store in it, runs two chaos_worker processes (tests/chaos/chaos_worker.cc: the holder and a
contender, one key "hot") against the cluster and cuts the network in the ways below, one
partition at a time, healing each before the next. Every run is judged by the chaos harness's
own checker (tests/chaos/chaos.py, check()): 0 overlapping validity windows, 0 stale fenced
writes accepted, 0 token regressions.

The network. Namespaces lhp<pid>-hub, lhp<pid>-m1..m3 (one per member) and lhp<pid>-c1, -c2
(one per worker): the pid of this run in every name, so two runs never collide. The hub holds a
bridge br0 (10.213.0.254/24) and the hub end of one veth pair per node; the node end is eth0 in
the node's namespace (members 10.213.0.1-3, workers 10.213.0.11-12). The addresses exist only
inside these namespaces: the host's own interfaces, routes and firewall are never touched.

Faults are nftables rules in the hub only (table `bridge lhp`, chain filt on the bridge's
forward hook), so no node's own network stack changes and every drop is silent (no RST, no
ICMP, TCP just retransmits), as a real partition is:

  member               isolate the member the holder talks to (every frame in or out of its port).
                       The holder's member is the one its most recently used TCP connection goes
                       to (`ss -tni` in the holder's namespace, smallest lastsnd: the lease's
                       keep-alive stream on etcd, the lease's session on ZooKeeper).
  leader               isolate the cluster's leader (etcd: `etcdctl endpoint status`, the member
                       whose id is its own leader; ZooKeeper: `srvr`, Mode: leader).
  holder               isolate the holder's namespace from everyone.
  oneway-to-holder     IPv4 frames toward the holder dropped (`oifname`): its requests reach
                       the cluster, the replies never reach it. ARP passes, so the cut is
                       purely one-way.
  oneway-from-holder   IPv4 frames from the holder dropped (`iifname`): it hears the cluster,
                       the cluster never hears it.
  leader-peers         cut the leader off from the other members only; every client still
                       reaches it (Jepsen's favourite: a leader that clients can talk to but
                       that has lost its quorum, and may not know it yet).
  oneway-to-leader     IPv4 frames toward the leader dropped: it hears nobody (peers, clients),
                       everybody hears it.

Each partition lasts 2.5-3.5 x TTL (long enough for a lease to expire behind it), then the
chain is flushed (heal) and the run waits until the cluster is whole again (3 members up, one
leader) and some worker holds the key before the next partition. The orchestrator itself
reaches the members from the hub (etcdctl, ZooKeeper's four-letter words), which the bridge
forward chain does not filter.

The fenced register (tests/chaos/fenced_register.h) is a SQLite file in the run directory on
the host's file system. `ip netns exec` changes only the network namespace, so the workers open
the same file (same inode, same POSIX locks) from theirs: the register stays reachable from a
partitioned holder, which is the dangerous case (the store is cut off, the data is not).
Event logs are files too, and CLOCK_BOOTTIME is one clock for every namespace.

Takeover time, per partition: from the fault to the first grant by a worker other than the one
that held at the fault, if one comes before the next fault ("kept" otherwise: the holder rode
it out, e.g. by failing over to another member; "regained" if it lost the key and got it back
first). A partition during which the holder released the key by itself is not counted. The
time from the fault to the holder's own loss (lost or invalid) is printed too: the checker
makes sure that it always comes before the next grant. Figures are printed per kind:

  partition: store=<s> kind=<k> n=<n> takeover=<n> regained=<n> kept=<n> released=<n>
             after_heal=<n> lost_after_heal=<n> takeover_ms p50=<n> max=<n> holder_lost_ms p50=<n> max=<n>

and one summary line:

  partition: store=<s> partitions=<n> takeovers=<n> overlaps=<n> stale_attempted=<n>
             stale_accepted=<n> violations=<n>

Exit status: 0 clean; 1 on any violation (the run directory is kept and named); 2 if the run
could not have shown anything (the cluster never settled, no partition ended in a takeover, a
worker crashed) twice in a row: an ineffective run is run once more with the seed's next draws;
77 (CTest's SKIP_RETURN_CODE) if network namespaces cannot be created here
(not root, no `ip netns`, no nft, no store binary), with the reason on stdout.

  partition.py --worker PATH --store etcd|zk [--store ...] --quick      (CTest, label partition)
  partition.py --worker PATH --store etcd --store zk --partitions 56    (the long run, by hand)
  ... --kinds member,leader --etcd-pre-vote   (only these kinds; etcd members with pre-vote on)

Cleanup: every process is started in its own session with PR_SET_PDEATHSIG=SIGKILL and is
killed by its process group (its own pid); namespaces are deleted in try/finally, atexit and on SIGTERM/SIGINT/SIGHUP. A run
killed with SIGKILL cannot clean up: the next run deletes namespaces lhp<pid>-* whose pid is
gone (killing what still runs in them).
"""

import argparse
import atexit
import ctypes
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "chaos"))
import chaos  # noqa: E402  (the harness: Orchestrator, check(), the register schema)
from chaos import MS, now_ns  # noqa: E402

SKIP_RC = 77
PREFIX = "lhp"
SUBNET = "10.213.0"
HUB_IP = SUBNET + ".254"
MEMBERS = ("m1", "m2", "m3")
CLIENTS = ("c1", "c2")
KINDS = ("member", "leader", "holder", "oneway-to-holder", "leader-peers", "oneway-to-leader",
         "oneway-from-holder")
QUICK_KINDS = KINDS[:5]
NFT_TABLE = """table bridge lhp {
  chain filt { type filter hook forward priority 0; policy accept; }
}
"""

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    # PR_SET_PDEATHSIG (1): a member or worker gets SIGKILL if this harness dies, even by
    # SIGKILL (a CTest timeout), so no store keeps running in a namespace nobody deletes.
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


class Skip(Exception):
    pass


class NetError(Exception):
    pass


def sh(*cmd, check=True, input=None, timeout=30):
    r = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise NetError(f"{' '.join(cmd)}: rc {r.returncode}: {r.stderr.strip()}")
    return r


# ---- cleanup ------------------------------------------------------------------------------

_cleanups = []


def run_cleanups():
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # cleanup goes on whatever one step did
            print(f"partition: cleanup step failed: {e}", file=sys.stderr)


def _on_signal(sig, _frame):
    raise SystemExit(128 + sig)  # unwinds through every finally, then atexit


def kill_group(proc):
    """SIGKILLs a child started with start_new_session (its process group) and reaps it."""
    if proc.poll() is None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def delete_netns(name):
    """Kills whatever still runs in namespace `name` (by pid), then deletes it."""
    r = sh("ip", "netns", "pids", name, check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    sh("ip", "netns", "del", name, check=False)


def sweep_stale_namespaces():
    """Deletes namespaces of earlier runs (lhp<pid>-*) whose pid no longer lives."""
    r = sh("ip", "netns", "list", check=False)
    for line in r.stdout.splitlines():
        m = re.match(rf"({PREFIX}(\d+)-\S+)", line)
        if not m or int(m.group(2)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(2)), 0)
            continue  # that run is alive: its namespaces are its own business
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        print(f"partition: deleting stale namespace {m.group(1)}", flush=True)
        delete_netns(m.group(1))


# ---- network ------------------------------------------------------------------------------


class Net:
    """The hub namespace with its bridge, a namespace per node, and the fault rules."""

    def __init__(self):
        self.tag = f"{PREFIX}{os.getpid()}"
        self.hub = f"{self.tag}-hub"
        self.ip = {}  # node name -> address
        self.created = []
        _cleanups.append(self.destroy)

    def ns(self, node):
        return f"{self.tag}-{node}"

    def setup(self, nodes):
        sh("ip", "netns", "add", self.hub)
        self.created.append(self.hub)
        hub = ["ip", "-n", self.hub]
        sh(*hub, "link", "set", "lo", "up")
        sh(*hub, "link", "add", "br0", "type", "bridge")
        sh(*hub, "addr", "add", HUB_IP + "/24", "dev", "br0")
        sh(*hub, "link", "set", "br0", "up")
        sh("ip", "netns", "exec", self.hub, "nft", "-f", "-", input=NFT_TABLE)
        for node, octet in nodes:
            ns = self.ns(node)
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # `name` spelled out: `ip link add m1 ...` would read a short name as a keyword.
            sh(*hub, "link", "add", "name", node, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh(*hub, "link", "set", node, "master", "br0", "up")
            self.ip[node] = f"{SUBNET}.{octet}"
            sh("ip", "-n", ns, "addr", "add", self.ip[node] + "/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def node_of_ip(self, ip):
        for n, a in self.ip.items():
            if a == ip:
                return n
        return None

    def exec_in(self, node):
        return ["ip", "netns", "exec", self.ns(node)]

    def hub_run(self, *cmd, timeout=10, env=None):
        return subprocess.run(["ip", "netns", "exec", self.hub, *cmd], capture_output=True,
                              text=True, timeout=timeout, env=env)

    def _nft(self, *words):
        sh("ip", "netns", "exec", self.hub, "nft", "add", "rule", "bridge", "lhp", "filt",
           *words)

    def isolate(self, node):
        self._nft("iifname", node, "drop")
        self._nft("oifname", node, "drop")

    def drop_to(self, node):
        self._nft("oifname", node, "ether", "type", "ip", "drop")

    def drop_from(self, node):
        self._nft("iifname", node, "ether", "type", "ip", "drop")

    def cut(self, a, b):
        self._nft("iifname", a, "oifname", b, "drop")
        self._nft("iifname", b, "oifname", a, "drop")

    def heal(self):
        sh("ip", "netns", "exec", self.hub, "nft", "flush", "chain", "bridge", "lhp", "filt")

    def destroy(self):
        for ns in reversed(self.created):
            delete_netns(ns)
        self.created.clear()


def probe_namespaces():
    """Raises Skip (with the reason) where this machine cannot run the test."""
    if os.geteuid() != 0:
        raise Skip("not root: creating network namespaces needs CAP_SYS_ADMIN")
    for tool in ("ip", "nft", "ss"):
        if shutil.which(tool) is None:
            raise Skip(f"no `{tool}` on PATH (iproute2 / nftables)")
    name = f"{PREFIX}{os.getpid()}-probe"
    r = sh("ip", "netns", "add", name, check=False)
    if r.returncode != 0:
        raise Skip(f"`ip netns add` failed: {r.stderr.strip()}")
    try:
        r = sh("ip", "netns", "exec", name, "nft", "-f", "-", input=NFT_TABLE, check=False)
        if r.returncode != 0:
            raise Skip(f"nftables bridge table refused in a namespace: {r.stderr.strip()}")
    finally:
        delete_netns(name)


# ---- clusters -----------------------------------------------------------------------------


class Cluster:
    scheme = "?"
    ttl_ms = 2000
    client_port = 0

    def __init__(self, net, run_dir):
        self.net = net
        self.run_dir = run_dir
        self.procs = {}
        _cleanups.append(self.stop)

    def _spawn(self, member, cmd, log_name, cwd=None):
        log = open(os.path.join(self.run_dir, log_name), "ab")
        self.procs[member] = subprocess.Popen(
            self.net.exec_in(member) + cmd, stdout=log, stderr=log, cwd=cwd,
            start_new_session=True, preexec_fn=die_with_parent)
        log.close()

    def endpoints(self, order):
        return [f"{self.net.ip[m]}:{self.client_port}" for m in order]

    def roles(self):
        """{member: 'leader' | 'follower' | None (no answer)}."""
        raise NotImplementedError

    def leader(self):
        r = self.roles()
        ls = [m for m, role in r.items() if role == "leader"]
        return ls[0] if len(ls) == 1 else None

    def whole(self):
        r = self.roles()
        return (sorted(r.values(), key=str) == ["follower", "follower", "leader"])

    def wait_whole(self, timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for m, p in self.procs.items():
                if p.poll() is not None:
                    raise NetError(f"{self.scheme} member {m} exited (rc {p.returncode})")
            if self.whole():
                return True
            time.sleep(0.2)
        return False

    def stop(self):
        for p in self.procs.values():
            kill_group(p)
        self.procs.clear()


class EtcdCluster(Cluster):
    """Three etcd 3.4 members, each in its namespace, listening on its own address only
    (client 12379, peer 12380; no other etcd can be there, the namespace is ours). Raft
    timings are etcd's defaults (heartbeat 100 ms, election 1000 ms), and so is pre-vote (off
    in 3.4: a member coming back from a partition with a higher term forces an election).
    TTL 2 s: etcd keeps no lease shorter."""

    scheme = "etcd"
    ttl_ms = 2000
    client_port = 12379
    peer_port = 12380
    pre_vote = False  # etcd 3.4's default; --etcd-pre-vote turns it on

    def start(self):
        ip = self.net.ip
        cluster = ",".join(f"{m}=http://{ip[m]}:{self.peer_port}" for m in MEMBERS)
        for m in MEMBERS:
            client = f"http://{ip[m]}:{self.client_port}"
            peer = f"http://{ip[m]}:{self.peer_port}"
            self._spawn(m, ["/usr/bin/etcd", "--name", m,
                            "--data-dir", os.path.join(self.run_dir, f"etcd-{m}"),
                            "--listen-client-urls", client, "--advertise-client-urls", client,
                            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                            "--initial-cluster", cluster, "--initial-cluster-state", "new",
                            "--initial-cluster-token", self.net.tag]
                        + (["--pre-vote=true"] if self.pre_vote else []),
                        f"etcd-{m}.log")

    def url(self, order):
        return f"etcd://{','.join(self.endpoints(order))}?prefix=chaos&command_timeout=500ms"

    def roles(self):
        env = dict(os.environ, ETCDCTL_API="3")
        r = self.net.hub_run("/usr/bin/etcdctl", "--endpoints=" + ",".join(
            self.endpoints(MEMBERS)), "--dial-timeout=500ms", "--command-timeout=700ms",
            "endpoint", "status", "-w", "json", timeout=10, env=env)
        out = {m: None for m in MEMBERS}
        try:
            statuses = json.loads(r.stdout) if r.stdout.strip() else []
        except json.JSONDecodeError:
            return out
        for s in statuses:
            host = s.get("Endpoint", "").rsplit(":", 1)[0]
            m = self.net.node_of_ip(host)
            st = s.get("Status", {})
            if m is None or not st:
                continue
            own = st.get("header", {}).get("member_id")
            lead = st.get("leader")
            if not lead:
                continue  # a member that knows no leader is not part of a whole cluster
            out[m] = "leader" if own == lead else "follower"
        return out


ZK_CLASSPATH = ("/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:"
                "/usr/share/java/log4j-1.2.jar")

# Asks each address for `srvr` from inside the hub namespace; prints "<ip> <mode or ->".
ZK_SRVR = r"""
import socket, sys
for ip in sys.argv[2:]:
    mode = "-"
    try:
        with socket.create_connection((ip, int(sys.argv[1])), timeout=0.7) as c:
            c.settimeout(0.7)
            c.sendall(b"srvr")
            data = b""
            while True:
                b = c.recv(4096)
                if not b:
                    break
                data += b
        for line in data.decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                mode = line.split()[1]
    except OSError:
        pass
    print(ip, mode)
"""


class ZkEnsemble(Cluster):
    """Three ZooKeeper 3.8 servers (QuorumPeerMain, a JVM each, -Xmx128m), each in its
    namespace, client port 12181 on its own address, quorum 12888 / election 13888.
    tickTime 100 ms (initLimit 20, syncLimit 5: a follower is dropped after 500 ms of
    silence), as the chaos harness's standalone server; TTL 2 s (the lease's session timeout),
    as etcd's, so the takeover figures compare."""

    scheme = "zk"
    ttl_ms = 2000
    client_port = 12181

    def start(self):
        ip = self.net.ip
        servers = "".join(f"server.{i + 1}={ip[m]}:12888:13888\n" for i, m in enumerate(MEMBERS))
        for i, m in enumerate(MEMBERS):
            d = os.path.join(self.run_dir, f"zk-{m}")
            os.makedirs(os.path.join(d, "data"))
            with open(os.path.join(d, "data", "myid"), "w") as f:
                f.write(f"{i + 1}\n")
            with open(os.path.join(d, "zoo.cfg"), "w") as f:
                f.write(f"tickTime=100\ninitLimit=20\nsyncLimit=5\ndataDir={d}/data\n"
                        f"clientPort={self.client_port}\nclientPortAddress={ip[m]}\n"
                        "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n"
                        "maxClientCnxns=0\nminSessionTimeout=200\nmaxSessionTimeout=60000\n"
                        "forceSync=no\npreAllocSize=1024\n" + servers)
            with open(os.path.join(d, "log4j.properties"), "w") as f:
                f.write("log4j.rootLogger=INFO, CONSOLE\n"
                        "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
                        "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
                        "log4j.appender.CONSOLE.layout.ConversionPattern=%d %-5p %c{1} - %m%n\n")
            self._spawn(m, ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                            f"-Dlog4j.configuration=file:{d}/log4j.properties",
                            "-cp", ZK_CLASSPATH,
                            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                            os.path.join(d, "zoo.cfg")], f"zk-{m}.log", cwd=d)

    def url(self, order):
        return f"zk://{','.join(self.endpoints(order))}/chaos"

    def roles(self):
        r = self.net.hub_run(sys.executable, "-c", ZK_SRVR, str(self.client_port),
                             *[self.net.ip[m] for m in MEMBERS], timeout=10)
        out = {m: None for m in MEMBERS}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] in ("leader", "follower"):
                out[self.net.node_of_ip(parts[0])] = parts[1]
        return out


CLUSTERS = {"etcd": EtcdCluster, "zk": ZkEnsemble}


# ---- the run ------------------------------------------------------------------------------


SCENARIO = {"partition": dict(keys=["hot"], faults={}, quick_s=0, needs_stale=False)}


class PartitionOrchestrator(chaos.Orchestrator):
    """The chaos harness's orchestrator with the workers in the client namespaces (one each)
    and partitions in place of pauses and kills."""

    def __init__(self, args, cluster, net, run_dir, rng):
        super().__init__(args, cluster, "partition", run_dir, rng, [], scenarios=SCENARIO)
        self.cluster = cluster
        self.net = net
        self.slot = {}  # worker id -> client namespace
        self.liveness = []  # notes: settles that timed out

    def worker_url(self, wid):
        busy = {self.slot[w] for _, w in self.procs.values()}
        free = [c for c in CLIENTS if c not in busy]
        c = free[0] if free else CLIENTS[0]
        self.slot[wid] = c
        # Each client starts on a different member: the endpoint list rotated by its index.
        i = CLIENTS.index(c)
        return self.cluster.url(MEMBERS[i:] + MEMBERS[:i])

    def wrap_worker(self, wid, cmd):
        return self.net.exec_in(self.slot[wid]) + cmd

    worker_preexec = staticmethod(die_with_parent)

    def holder(self):
        for pid, (_, wid) in self.procs.items():
            if self.holding.get(wid):
                return wid
        return None

    def pump(self, until_ns, end_ns):
        while now_ns() < until_ns:
            self.tail_logs()
            self.reap(end_ns, respawn=True)
            time.sleep(0.01)

    def settle(self, end_ns, timeout_s):
        """Waits until the cluster is whole and a worker holds the key (and has held it for
        a renew round, so its session is up): the state every partition starts from."""
        deadline = now_ns() + int(timeout_s * 1e9)
        since = None
        while now_ns() < deadline:
            self.pump(now_ns() + 200 * MS, end_ns)
            h = self.holder()
            if h is not None and self.cluster.whole():
                since = since or now_ns()
                if now_ns() - since >= self.ttl_ns // 2:
                    return h
            else:
                since = None
        return None

    def holder_member(self, wid):
        """The member of the holder's most recently written TCP connection to a client port."""
        r = sh(*self.net.exec_in(self.slot[wid]), "ss", "-Htni", "state", "established",
               check=False)
        best = None
        peer = None
        for line in r.stdout.splitlines():
            if not line.startswith((" ", "\t")):
                fields = line.split()
                peer = fields[-1] if fields else None
                continue
            m = re.search(r"lastsnd:(\d+)", line)
            if peer is None or m is None:
                continue
            host, _, port = peer.rpartition(":")
            # gRPC's sockets are dual-stack: ss prints "[::ffff:10.213.0.1]:12379".
            host = host.strip("[]").removeprefix("::ffff:")
            if port != str(self.cluster.client_port):
                continue
            node = self.net.node_of_ip(host)
            if node and (best is None or int(m.group(1)) < best[0]):
                best = (int(m.group(1)), node)
        return best[1] if best else None

    def partition(self, kind, holder):
        """Applies one partition; returns (target node, leader before it, how the target was
        found)."""
        leader = self.cluster.leader()
        how = "leader" if kind in ("leader", "leader-peers", "oneway-to-leader") else "holder"
        if kind == "member":
            target = self.holder_member(holder)
            how = "ss"
            if target is None:  # no connection seen: the first member of its URL
                target, how = MEMBERS[CLIENTS.index(self.slot[holder])], "url-order"
            self.net.isolate(target)
        elif kind == "leader":
            target = leader or MEMBERS[0]
            self.net.isolate(target)
        elif kind == "holder":
            target = self.slot[holder]
            self.net.isolate(target)
        elif kind == "oneway-to-holder":
            target = self.slot[holder]
            self.net.drop_to(target)
        elif kind == "oneway-from-holder":
            target = self.slot[holder]
            self.net.drop_from(target)
        elif kind == "leader-peers":
            target = leader or MEMBERS[0]
            for m in MEMBERS:
                if m != target:
                    self.net.cut(target, m)
        elif kind == "oneway-to-leader":
            target = leader or MEMBERS[0]
            self.net.drop_to(target)
        else:
            raise ValueError(kind)
        return target, leader, how

    def run_partitions(self, plan, rng):
        self.faults = 0
        start = now_ns()
        # The workers' own deadline: past the last partition (they are stopped at the end).
        end = start + int((len(plan) * 12 * self.ttl_ns) + 120e9)
        self.log("run-start", scenario="partition", ttl_ms=self.args.ttl_ms, end=end,
                 store=self.cluster.scheme, guard="register", partitions=len(plan))
        db = sqlite3.connect(os.path.join(self.run_dir, "register.db"))
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(chaos.REGISTER_SCHEMA)
        db.close()
        for _ in range(self.args.workers):
            self.spawn(end)
        try:
            for kind in plan:
                holder = self.settle(end, timeout_s=30)
                if holder is None:
                    self.liveness.append(f"no settled holder within 30 s before {kind}")
                    self.log("settle-timeout", kind=kind)
                    if self.args.liveness_findings:
                        break  # a stalled cluster stays stalled: the rest would wait 30 s each
                    continue
                target, leader, how = self.partition(kind, holder)
                self.faults += 1
                dur = int(rng.uniform(2.5, 3.5) * self.ttl_ns)
                self.log("partition", kind=kind, target=target, holder=holder,
                         holder_ns=self.slot[holder], leader=leader or "-", found_by=how,
                         dur_ms=dur // MS)
                # The same as the checker's store faults, so that its false-loss figure knows
                # of the partitions.
                self.log("store-fault", kind="partition-" + kind, dur_ms=dur // MS)
                self.pump(now_ns() + dur, end)
                self.net.heal()
                self.log("heal", kind=kind)
            if not self.liveness and self.settle(end, timeout_s=30) is None:
                self.liveness.append("no settled holder within 30 s after the last heal")
        finally:
            self.net.heal()
            for pid, (p, wid) in list(self.procs.items()):
                self.log("final-kill", pid=pid, worker=wid)
                self.signal(pid, signal.SIGKILL)
                p.wait()
            self.procs.clear()
            self.log("run-end", faults=self.faults)
            self.log_f.close()


def takeovers(run_dir):
    """Per partition, from orch.log and the workers' logs, between the fault and the next one:
    dict(kind, outcome, takeover_ms, lost_ms, after_heal). outcome: 'takeover' (another worker
    was granted the key), 'regained' (the holder lost it and was granted it again first), 'kept'
    (the holder never lost it), 'released' (the holder released it by itself, still valid: not
    a partition's doing, not counted). lost_ms: fault to the holder's loss (lost or invalid,
    the earlier), if any; after_heal, lost_after_heal: the takeover, the loss came after the
    heal (a cluster that re-elects when the cut member comes back)."""
    orch = []
    with open(os.path.join(run_dir, "orch.log")) as f:
        for line in f:
            e = chaos.parse_line(line)
            if e:
                orch.append(e)
    parts = [(t, f) for t, _, ev, f in orch if ev == "partition"]
    heals = [t for t, _, ev, f in orch if ev == "heal"]
    end = max((t for t, *_ in orch), default=0)
    events = []  # (t, worker, event, fields)
    for name in os.listdir(run_dir):
        if name.startswith("w") and name.endswith(".log"):
            with open(os.path.join(run_dir, name)) as f:
                for line in f:
                    e = chaos.parse_line(line)
                    if e and e[2] in ("acquired", "release-sent", "lost", "invalid"):
                        events.append((e[0], e[1], e[2], e[3]))
    events.sort(key=lambda e: e[0])
    out = []
    for i, (t, f) in enumerate(parts):
        t_next = parts[i + 1][0] if i + 1 < len(parts) else end
        t_heal = next((h for h in heals if h >= t), end)
        holder = f["holder"]
        row = dict(kind=f["kind"], outcome="kept", takeover_ms=None, lost_ms=None,
                   after_heal=False, lost_after_heal=False)
        for et, w, ev, ef in events:
            if not t <= et < t_next:
                continue
            if w == holder and ev in ("lost", "invalid") and row["lost_ms"] is None:
                row["lost_ms"] = (et - t) / MS
                row["lost_after_heal"] = et >= t_heal
            elif w == holder and ev == "release-sent" and ef.get("after_invalid") != "1" \
                    and row["lost_ms"] is None:
                row["outcome"] = "released"
                break
            elif ev == "acquired" and w != holder:
                row.update(outcome="takeover", takeover_ms=(et - t) / MS,
                           after_heal=et >= t_heal)
                break
            elif ev == "acquired" and w == holder and row["lost_ms"] is not None:
                row["outcome"] = "regained"
                break
        out.append(row)
    return out


def run_store(args, store_name, plan, rng):
    cls = CLUSTERS[store_name]
    run_dir = tempfile.mkdtemp(prefix=f"partition-{store_name}-", dir=args.workdir)
    net = Net()
    cluster = cls(net, run_dir)
    ok = False
    try:
        net.setup([(m, i + 1) for i, m in enumerate(MEMBERS)] +
                  [(c, 11 + i) for i, c in enumerate(CLIENTS)])
        t0 = time.time()
        cluster.start()
        if not cluster.wait_whole(90):
            print(f"partition: store={store_name} the cluster did not come up within 90 s "
                  f"(logs in {run_dir})", flush=True)
            return 2
        print(f"partition: store={store_name} cluster up in {time.time() - t0:.1f} s "
              f"(leader {cluster.leader()})", flush=True)
        wargs = argparse.Namespace(
            worker=args.worker, ttl_ms=cluster.ttl_ms, hold_min_ms=args.hold_min_ms,
            hold_max_ms=args.hold_max_ms, write_gap_ms=args.write_gap_ms, idle_max_ms=40,
            ignore_sigpipe=False, workers=len(CLIENTS), guard="register",
            scenario_name="partition", limit=1,  # exclusive leases (chaos.py --limit)
            liveness_findings=args.liveness_findings)
        orch = PartitionOrchestrator(wargs, cluster, net, run_dir, rng)
        orch.run_partitions(plan, rng)
        cluster.stop()
        r = chaos.check(run_dir, cluster.ttl_ms, store_name, "partition", False)
        rows = takeovers(run_dir)
        handoffs = 0
        for kind in KINDS:
            ks = [x for x in rows if x["kind"] == kind]
            if not ks:
                continue
            count = {o: sum(1 for x in ks if x["outcome"] == o)
                     for o in ("takeover", "regained", "kept", "released")}
            times = [x["takeover_ms"] for x in ks if x["outcome"] == "takeover"]
            lost = [x["lost_ms"] for x in ks if x["lost_ms"] is not None]
            print(f"partition: store={store_name} kind={kind} n={len(ks)} "
                  + " ".join(f"{o}={c}" for o, c in count.items())
                  + f" after_heal={sum(1 for x in ks if x['after_heal'])}"
                  f" lost_after_heal={sum(1 for x in ks if x['lost_after_heal'])}"
                  f" takeover_ms p50={round(chaos.pct(times, 0.5))} "
                  f"max={round(max(times, default=0))} "
                  f"holder_lost_ms p50={round(chaos.pct(lost, 0.5))} "
                  f"max={round(max(lost, default=0))}", flush=True)
            handoffs += len(times)
        print(f"partition: store={store_name} partitions={len(rows)} takeovers={handoffs} "
              f"overlaps={r['overlaps']} stale_attempted={r['stale_attempted']} "
              f"stale_accepted={r['stale_accepted']} violations={r['violations']} "
              f"dir={run_dir}", flush=True)
        for note in orch.liveness:
            print(f"  liveness: {note}")
        if r["violations"]:
            print(f"partition: store={store_name} VIOLATIONS: run directory kept: {run_dir}")
            return 1
        if orch.liveness and args.liveness_findings and handoffs > 0 and not r["ineffective"]:
            # Safety was judged over every partition applied, and one ended in a takeover: the
            # stall is reported as a finding (README, "Partitions") instead of a failed run.
            print(f"partition: store={store_name} LIVENESS FINDING: {len(rows)}/{len(plan)} "
                  f"partitions applied before the stall, {handoffs} takeovers, no safety "
                  f"violation; run directory kept: {run_dir}")
            return 0
        if r["ineffective"] or handoffs == 0 or len(rows) < len(plan) or orch.liveness:
            print(f"partition: store={store_name} ineffective: {len(rows)}/{len(plan)} "
                  f"partitions applied, {handoffs} takeovers; run directory kept: {run_dir}")
            return 2
        ok = True
        return 0
    finally:
        cluster.stop()
        net.destroy()
        if ok and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", required=True, help="path to chaos_worker")
    ap.add_argument("--store", action="append", choices=sorted(CLUSTERS), required=True)
    ap.add_argument("--quick", action="store_true",
                    help="the CTest run: five partitions per store, one each of member, "
                         "leader, holder, oneway-to-holder, leader-peers")
    ap.add_argument("--partitions", type=int, default=None,
                    help="partitions per store (default: one of each kind with --quick, eight "
                         "of each else: 56), the kinds in turn")
    ap.add_argument("--hold-min-ms", type=int, default=20000,
                    help="a worker holds the key this long at least (long: the partitions, "
                         "not releases, make the handoffs)")
    ap.add_argument("--hold-max-ms", type=int, default=40000)
    ap.add_argument("--write-gap-ms", type=int, default=15)
    ap.add_argument("--etcd-pre-vote", action="store_true",
                    help="start the etcd members with --pre-vote=true (off by default in 3.4)")
    ap.add_argument("--kinds", default=None,
                    help="comma-separated partition kinds to take in turn (default: all; "
                         "--quick: the five CI ones)")
    ap.add_argument("--liveness-findings", action="store_true",
                    help="a stall (no settled holder within 30 s) ends the run's plan and is "
                         "reported as a LIVENESS FINDING, exit 0 if safety held and a partition "
                         "ended in a takeover (the CTest run; without it a stall makes the run "
                         "ineffective, exit 2 if twice)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep run directories of clean runs")
    args = ap.parse_args()
    if not os.access(args.worker, os.X_OK):
        ap.error("--worker must name the chaos_worker executable")
    kinds = QUICK_KINDS if args.quick else KINDS
    if args.kinds:
        kinds = tuple(args.kinds.split(","))
        if not set(kinds) <= set(KINDS):
            ap.error(f"--kinds: one of {', '.join(KINDS)}")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    atexit.register(run_cleanups)
    try:
        probe_namespaces()
        for s in args.store:
            binary = "/usr/bin/etcd" if s == "etcd" else "/usr/share/java/zookeeper.jar"
            if not os.path.exists(binary) or (s == "zk" and shutil.which("java") is None):
                raise Skip(f"no {s} server here ({binary}, java)")
    except Skip as e:
        print(f"partition: SKIP: {e}", flush=True)
        return SKIP_RC
    sweep_stale_namespaces()
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"partition: seed={seed} (rerun with --seed {seed})", flush=True)
    rng = random.Random(seed)
    n = args.partitions or (len(kinds) if args.quick else 8 * len(kinds))
    EtcdCluster.pre_vote = args.etcd_pre_vote
    plan = [kinds[i % len(kinds)] for i in range(n)]
    status = 0
    for s in args.store:
        t0 = time.time()
        rc = run_store(args, s, plan, rng)
        print(f"partition: store={s} rc={rc} wall={time.time() - t0:.1f}s", flush=True)
        if rc == 2:
            # Ineffective (no takeover, a partition not applied, a worker crash, no settled
            # holder in time: a loaded machine, never a safety finding) is run once more with
            # the seed's next draws, as chaos.py does; violations always count.
            print(f"partition: store={s} was ineffective; running it once more", flush=True)
            t0 = time.time()
            rc = run_store(args, s, plan, rng)
            print(f"partition: store={s} rc={rc} wall={time.time() - t0:.1f}s", flush=True)
        status = 1 if 1 in (status, rc) else max(status, rc)
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        run_cleanups()
