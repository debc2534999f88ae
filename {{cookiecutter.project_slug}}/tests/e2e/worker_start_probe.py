"""Run under torchrun, as a module, by tests/e2e/test_launch.py: prints, as one JSON line, what a worker
has of its process (the same whether it was forked from the agent or started as a new interpreter),
then exits with PROBE_EXIT_CODE."""

import json
import os
import signal
import sys

import torch

if __name__ == "__main__":
    handlers = {
        sig.name: getattr(handler := signal.getsignal(sig), "name", str(handler))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    print(json.dumps({
        "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
        "name": __name__,
        "session_leader": os.getsid(0) == os.getpid(),
        "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "handlers": handlers,
        "threads": torch.get_num_threads(),
        "rank": os.environ["RANK"],
        "unbuffered": sys.stdout.write_through,
    }))  # fmt: skip
    sys.exit(int(os.environ.get("PROBE_EXIT_CODE", "0")))
