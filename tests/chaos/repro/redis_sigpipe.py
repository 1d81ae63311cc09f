#!/usr/bin/env python3
"""Reproduction (found by the chaos harness): a process using redis:// dies of SIGPIPE when its
connections to the server are reset (here: the harness's TCP proxy closes them with RST, as a
middlebox, a failover or a server restart does). Expected: the call returns kUnavailable, the
lease goes at risk or lost, the process lives on.

Usage: redis_sigpipe.py path/to/chaos_worker      (exit 0: survived; 1: died)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from chaos import FaultProxy, free_port  # noqa: E402

worker = sys.argv[1]
d = tempfile.mkdtemp()
port = free_port()
redis = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", d,
                          "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
time.sleep(0.3)
proxy = FaultProxy(port)
w = subprocess.Popen([worker, f"--store=redis://127.0.0.1:{proxy.port}", f"--register={d}/reg.db",
                      f"--log={d}/w.log", "--keys=hot", "--ttl-ms=500", "--duration-ms=4000"],
                     stderr=subprocess.DEVNULL)
for _ in range(6):
    time.sleep(0.5)
    proxy.reset()
rc = w.wait()
redis.kill()
print(f"worker exit status: {rc}" + (" (killed by SIGPIPE)" if rc == -signal.SIGPIPE else ""))
sys.exit(0 if rc == 0 else 1)
