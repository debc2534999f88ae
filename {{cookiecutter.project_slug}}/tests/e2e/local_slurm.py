"""A private Slurm cluster for tests (real slurmctld, slurmd; no /etc/slurm): two hosts played by two network
namespaces on this machine (two_node_slurm); clients use SLURM_CONF. A test module's cluster:
slurm_for_tests, one at a time on this machine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

REQUIRED = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "munged", "munge")
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
MUNGE_KEY = pathlib.Path("/etc/munge/munge.key")
# One cluster at a time on this machine: two test files on two xdist workers would share munged, which
# the first to end stops.
ONE_AT_A_TIME = pathlib.Path(tempfile.gettempdir()) / "ddp_template_local_slurm.lock"


def _which(name: str) -> str:
    # Debian puts the daemons in /usr/sbin, which is often missing from PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin") or ""


def _run(*cmd: str, where: tuple[str, ...] = (), **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """A client command; `where`: a prefix that runs it in another network namespace (nsenter)."""
    return subprocess.run([*where, _which(cmd[0]) or cmd[0], *cmd[1:]], capture_output=True, text=True, **kwargs)


def _spawn(cmd: list[str], log: pathlib.Path, where: tuple[str, ...] = (), **kwargs: Any) -> subprocess.Popen[bytes]:
    # A new session keeps a terminal's Ctrl-C away from the daemons: only local_slurm's cleanup stops them.
    with log.open("ab") as out:
        return subprocess.Popen([*where, _which(cmd[0]), *cmd[1:]], stdout=out, stderr=out, start_new_session=True,
                                **kwargs)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    proc.terminate()  # a no-op if it already exited
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(paths: list[pathlib.Path], lines: int = 30) -> str:
    return "\n".join(
        f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) for p in paths if p.is_file()
    )


def slurm_unavailable_reason() -> str | None:
    """Why a local Slurm cannot be started here (one line), or None if it can."""
    if os.geteuid() != 0:
        return "local Slurm needs root (slurmctld and slurmd run as root)"
    missing = [name for name in REQUIRED if not _which(name)]
    return f"not installed: {', '.join(missing)} (see .ci/install_slurm.sh)" if missing else None


def _start_munged(log: pathlib.Path) -> subprocess.Popen[bytes]:
    """Start munged in the foreground as the munge user (it insists on owning its key)."""
    user = "munge" if "munge" in {p.pw_name for p in pwd.getpwall()} else "root"
    if not MUNGE_KEY.exists():
        _run("mungekey", "--create", f"--keyfile={MUNGE_KEY}", check=True)
        shutil.chown(MUNGE_KEY, user, user)
    # /run is a tmpfs and, without systemd, nothing else creates munged's socket directory.
    pathlib.Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", user, user)
    proc = _spawn(["munged", "--foreground"], log, user=user, group=user, extra_groups=[])
    deadline = time.monotonic() + 10
    while _run("munge", "-n").returncode != 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"munged did not start\n{_tail([log, pathlib.Path('/var/log/munge/munged.log')])}")
        time.sleep(0.1)
    return proc


def _write_conf(workdir: pathlib.Path, host: str, nodes: list[tuple[str, str]] | None = None,
                ctld_address: str = "127.0.0.1") -> pathlib.Path:  # fmt: skip
    """slurm.conf: the controller on this host at `ctld_address`; `nodes` (name, address), this host by default."""
    nodes = nodes or [(host, "127.0.0.1")]
    per_node = "_%n" if len(nodes) > 1 else ""  # several slurmd on one file system: a spool, pid and log each
    # Ports asked of the OS, never fixed ones; both stay bound until both are known, so they differ.
    with socket.socket() as one, socket.socket() as two:
        one.bind(("", 0))
        two.bind(("", 0))
        ctld_port, slurmd_port = one.getsockname()[1], two.getsockname()[1]
    for sub in ("state", "spool", "log"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    # slurmd drains a node with less memory than RealMemory, so claim well below the real amount.
    memory = min(1024, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 2)
    conf = workdir / "slurm.conf"
    # CR_CPU: jobs share the node by CPU and are not given all its memory, so small jobs run side by side.
    # cred_expire: a requeued job waits this long before it may start again (default 120 s; sooner, and the node
    # refuses it, "Job credential revoked"); the scheduler intervals (default 60 s and 30 s) then start it at once.
    cpus = len(os.sched_getaffinity(0))
    node_lines = "\n".join(f"NodeName={name} NodeAddr={address} CPUs={cpus} RealMemory={memory} State=UNKNOWN"
                           for name, address in nodes)  # fmt: skip
    conf.write_text(
        f"""\
ClusterName=localtest
SlurmctldHost={host}({ctld_address})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool{per_node}
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd{per_node}.pid
SlurmctldLogFile={workdir}/log/slurmctld.log
SlurmdLogFile={workdir}/log/slurmd{per_node}.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
AuthInfo=cred_expire=5
SchedulerParameters=sched_interval=2,bf_interval=2
{node_lines}
PartitionName=debug Nodes={",".join(name for name, _ in nodes)} Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


def _kill_tagged(conf: str, spare: str = "") -> None:
    """SIGKILL every process whose environment names this cluster's slurm.conf (except those called `spare`)."""
    # Job tasks and slurmstepds all carry SLURM_CONF=<conf>, even children reparented to init that linuxproc lost,
    # and nothing else on the machine does. (Killing the pids `scontrol listpids` gave once hit unrelated processes.)
    tag = f"SLURM_CONF={conf}".encode()
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            if tag in (proc / "environ").read_bytes().split(b"\0") and (proc / "comm").read_text().strip() != spare:
                os.kill(int(proc.name), signal.SIGKILL)


def _cancel_all(env: dict[str, str], timeout: float = 15, where: tuple[str, ...] = ()) -> None:
    """Cancel every job and SIGKILL its tasks at once: a plain cancel waits KillWait (30 s) after SIGTERM."""
    _run("scancel", "--partition=debug", env=env, where=where)  # also drops pending jobs, so none starts meanwhile
    deadline = time.monotonic() + timeout
    while _run("squeue", "-h", env=env, where=where).stdout.strip() and time.monotonic() < deadline:
        _kill_tagged(env["SLURM_CONF"], spare="slurmstepd")  # it reports the job done once its tasks are gone
        time.sleep(0.2)


@contextlib.contextmanager
def two_node_slurm(workdir: pathlib.Path) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
    """Two hosts on this machine, each a network namespace with its own address (a veth pair between them)
    and a slurmd of its own (node0, node1), slurmctld on the first; yield the clients' env and the prefix
    that runs a client command where the controller is (nsenter into the first namespace). The daemons
    enter the network namespaces only (nsenter --net): `ip netns exec` would remount /sys without the
    cgroup file system slurmd wants. Needs root; skip-worthy errors are RuntimeErrors."""
    import uuid

    workdir = workdir.resolve()
    host = socket.gethostname().split(".")[0]
    tag = uuid.uuid4().hex[:6]
    octet = 16 + int(tag[:2], 16) % 200
    names, links = [f"slurm{tag}a", f"slurm{tag}b"], [f"vsl{tag}a", f"vsl{tag}b"]
    addresses = [f"10.{octet}.88.1", f"10.{octet}.88.2"]
    commands = [["ip", "netns", "add", name] for name in names]
    commands.append(["ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1]])
    for name, link, address in zip(names, links, addresses, strict=True):
        commands += [["ip", "link", "set", link, "netns", name], ["ip", "-n", name, "addr", "add", f"{address}/24",
                     "dev", link], ["ip", "-n", name, "link", "set", link, "up"], ["ip", "-n", name, "link", "set",
                     "lo", "up"]]  # fmt: skip
    where = [("nsenter", f"--net=/run/netns/{name}") for name in names]
    conf = _write_conf(workdir, host, [("node0", addresses[0]), ("node1", addresses[1])], ctld_address=addresses[0])
    log = workdir / "log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | {"SLURM_CONF": str(conf)}
    munged: subprocess.Popen[bytes] | None = None
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands:
            if (done := _run(*command)).returncode != 0:
                raise RuntimeError(f"cannot build network namespaces here: {' '.join(command)}: {done.stderr.strip()}")
        if _run("munge", "-n").returncode != 0:  # munged's socket is a file: every namespace shares it
            munged = _start_munged(log / "munged.out")
        daemons.append(_spawn(["slurmctld", "-D", "-c", "-i", "-f", str(conf)], log / "slurmctld.out", where[0]))
        for number, prefix in enumerate(where):
            daemons.append(_spawn(["slurmd", "-D", "-N", f"node{number}", "-f", str(conf)], log / f"node{number}.out",
                                  prefix))  # fmt: skip
        deadline = time.monotonic() + 30
        while (states := _run("sinfo", "-h", "-N", "-o", "%T", env=env, where=where[0]).stdout.split()) != ["idle"] * 2:
            if any(proc.poll() is not None for proc in daemons) or time.monotonic() > deadline:
                raise RuntimeError(f"the nodes are {states or 'unknown'}, not idle\n{_tail(sorted(log.glob('*')))}")
            time.sleep(0.2)
        yield env, where[0]
    finally:
        if daemons and all(proc.poll() is None for proc in daemons):
            _cancel_all(env, where=where[0])
        for proc in reversed(daemons):
            _stop(proc)
        _kill_tagged(str(conf))
        if munged is not None:
            _stop(munged)
        for name in names:
            _run("ip", "netns", "delete", name)


def wait_for_job(job_id: str, env: dict[str, str], timeout: float, where: tuple[str, ...] = ()) -> str:
    """Poll `scontrol show job` until the job is in a terminal state; return that state."""
    deadline = time.monotonic() + timeout
    state = "unknown"
    while time.monotonic() < deadline:
        proc = _run("scontrol", "-o", "show", "job", job_id, env=env, where=where)
        if proc.returncode != 0:  # e.g. the record was purged, MinJobAge (300 s) after the job ended
            raise RuntimeError(f"scontrol show job {job_id}: {proc.stderr.strip()}")
        if (match := re.search(r"\bJobState=(\S+)", proc.stdout)) and (state := match.group(1)) in TERMINAL_STATES:
            return state
        time.sleep(0.25)
    raise TimeoutError(f"job {job_id} still {state} after {timeout} s")


def submit(script: pathlib.Path, env: dict[str, str], *args: str, cwd: pathlib.Path) -> str:
    """`sbatch --parsable [args] script` in cwd; return the job id."""
    proc = _run("sbatch", "--parsable", *args, str(script), cwd=cwd, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]  # "id" or "id;cluster"


def slurm_for_tests(tmp_path_factory: Any) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
    """A test module's two-host Slurm (a module-scoped fixture's body): the environment its jobs run in (the
    project's job_env and the cluster's SLURM_*, one process per node) and the prefix of a client command.
    Skipped where no Slurm can run here; waits while another module's cluster runs (ONE_AT_A_TIME)."""
    import pytest

    from ..helpers import job_env

    if reason := slurm_unavailable_reason():
        pytest.skip(reason)
    with open(ONE_AT_A_TIME, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, a skip included
        try:
            cluster = two_node_slurm(tmp_path_factory.mktemp("slurm2"))
            env, where = cluster.__enter__()
        except RuntimeError as error:
            pytest.skip(f"no two-host Slurm here: {str(error).splitlines()[0]}")
        try:
            slurm = {k: v for k, v in env.items() if k.startswith("SLURM")}
            yield {**job_env(), **slurm, "NPROC_PER_NODE": "1"}, where
        finally:
            cluster.__exit__(None, None, None)
