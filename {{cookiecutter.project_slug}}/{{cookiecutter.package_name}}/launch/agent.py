"""torchrun's agent as the launcher starts it: `python -m <package>.launch.agent [torchrun's arguments]`, the same
agent as `python -m torch.distributed.run` but for its stores listening on STORE_ADDRESS_ENV alone where the
launcher sets it (the store has no authentication: docs/launching.md), and quieter: a forwarded signal ends it
with 128 + the signal, failed workers are summarised as torchrun does (exit code 1), and its exit barrier fails
in silence once node 0 has gone (node 0's launcher stops its agent, which serves that barrier's store, as soon
as a worker has refused or stopped the job)."""

# ruff: noqa: E402 (SIGINT's default comes before torch's import, below)
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from typing import Any

# Until torchrun starts the workers and puts in its own handlers, a stop signal ends the agent at once, SIGINT as
# SIGTERM and SIGHUP do: Python's KeyboardInterrupt would wait for the C++ call under way (the rendezvous's wait for
# the other nodes, up to WAIT_FOR_NODES_S), then print a traceback, as it does amid torch's import. The launcher
# says in one line that nothing was trained (launch/job.py).
if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)

from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server import api as agent_api
from torch.distributed.elastic.multiprocessing import api as processes_api
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, get_error_handler
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous, static_tcp_rendezvous
from torch.distributed.run import parse_args, run

from ..common.processes import exit_now
from ..common.run_dir import STORE_ADDRESS_ENV
from .forked import fork_workers

STORE_ARGUMENTS = ("host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant",
                   "master_listen_fd", "use_libuv")  # fmt: skip


def stores_listening_on(address: str) -> Any:
    """TCPStore, with a server's socket bound to `address` (TCPStore itself binds every interface)."""

    def store(*args: Any, **kwargs: Any) -> TCPStore:
        options = {**dict(zip(STORE_ARGUMENTS, args, strict=False)), **kwargs}
        if options.get("is_master") and options.get("master_listen_fd") is None:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            server = socket.create_server((address, int(options["port"])), family=family, backlog=2048)
            options["port"], options["master_listen_fd"] = server.getsockname()[1], server.detach()
        return TCPStore(**options)

    return store


def bind_stores(address: str) -> None:
    """Every store torchrun's agent serves (the rendezvous's, the static one, the workers') on `address`."""
    store = stores_listening_on(address)
    # Patches of torchrun's modules, which their types do not allow: a function for a class, a method replaced.
    c10d_rendezvous_backend.TCPStore = store  # type: ignore[misc]
    static_tcp_rendezvous.TCPStore = store  # type: ignore[misc]

    def bootstrap_store(self: Any, master_addr: str, master_port: int) -> TCPStore:
        return store(host_name=master_addr, port=master_port, is_master=True, multi_tenant=True)

    handler = dynamic_rendezvous.DynamicRendezvousHandler
    handler._create_tcp_store_server = bootstrap_store  # type: ignore[method-assign]


def not_exit_barrier_failure(record: logging.LogRecord) -> bool:
    """torchrun's log of its exit barrier failing (with a traceback) is dropped: this node's workers have ended
    by then, and the launcher's markers, not the barrier, say how the job ended."""
    return not str(record.msg).startswith("Error waiting on exit barrier")


def quiet_exit_barrier() -> None:
    agent_api.logger.addFilter(not_exit_barrier_failure)  # once: a filter already there is not added again


def stop_once() -> None:
    """torchrun's handler of SIGTERM, SIGINT and SIGHUP raises its stop in the agent's main thread once; a repeat
    soon after (Slurm signals every process of the step, and the launcher passes the same signal on) is ignored,
    not raised inside the first's handling (a `--- Logging error ---` and a traceback amid the shutdown)."""
    raise_stop = processes_api._terminate_process_handler
    if getattr(raise_stop, "once", False):
        return
    stopped: list[int] = []

    def once(signum: int, frame: Any) -> None:
        if not stopped:
            stopped.append(signum)
            raise_stop(signum, frame)

    once.once = True  # type: ignore[attr-defined]
    processes_api._terminate_process_handler = once  # looked up when torchrun registers its handlers


def main(argv: list[str] | None = None) -> int:
    quiet_exit_barrier()
    stop_once()
    if address := os.environ.get(STORE_ADDRESS_ENV):
        bind_stores(address)
    fork_workers()
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except SignalException as stop:
        return 128 + int(stop.sigval)
    except ChildFailedError as failed:  # what torchrun's @record does, less the agent's own traceback
        _, failure = failed.get_first_failure()
        if failure.error_file != "<N/A>":
            get_error_handler().dump_error_file(failure.error_file, failure.exitcode)
        print(failed.format_msg(), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    exit_now(main())  # the workers have ended: no second of torch's teardown before the launcher goes on
