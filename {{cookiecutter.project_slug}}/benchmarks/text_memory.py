"""Memory per rank of data=text (the corpus read into each rank) against data=tokens (token files each
rank memory-maps), at growing corpus sizes (docs/language_model.md):

    python benchmarks/text_memory.py [--sizes 0.25,1] [--nproc 2] [--steps 40] [--scratch DIR]

For each size it makes one corpus of the Python standard library's sources repeated to that many GB,
twice over the same bytes: token files (`prepare tokens stdlib OUT --repeat N`) and a folder of N
hard-linked copies of the sources (what data=text reads: its split numbers the files on, as --repeat
does). Then one torchrun job (--standalone, CPU processes, gloo) per data set trains the tiny GPT for
a fixed number of steps (one epoch), and each rank reports its peaks over the run: resident memory
(VmHWM of /proc/self/status), its own memory (Anonymous of /proc/self/smaps_rollup: the corpus read in,
for data=text), its PSS, and the file pages of the token files resident in its maps (data=tokens: the
pages its windows touched; the files dropped from the page cache first, so they are read from disk as
on a node that did not prepare them), the last three sampled every 0.2 s. samples/s is the job's, over all
ranks, from metrics.jsonl, the first interval (start-up) left out; "job s" is the whole torchrun job,
start-up and the corpus's reading included.
The files are removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_DIR))

import {{cookiecutter.package_name}} as package  # noqa: E402  (no torch: the package loads on use)

GB = 10**9


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.25,1", help="corpus sizes in GB (10^9 bytes), one pair of jobs each")
    parser.add_argument("--nproc", type=int, default=2, help="processes per job")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per job")
    parser.add_argument("--batch", type=int, default=12, help="windows per process per step")
    parser.add_argument("--scratch", default=None, help="where the corpora go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora")
    parser.add_argument("--data", default="text,tokens", help="which data sets to run (text, tokens or both)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_known_args()[0]


def worker() -> None:
    """One rank of a job: the project's own train entry, its peak memory written as it exits."""
    from {{cookiecutter.package_name}} import train

    overrides = sys.argv[sys.argv.index("--worker") + 1 :]
    run_dir = Path(next(item for item in overrides if item.startswith("hydra.run.dir=")).split("=", 1)[1])
    ending = train.exit_now

    peaks = {"anonymous_kib": 0, "pss_kib": 0, "corpus_kib": 0}

    def sample() -> None:  # over the whole run: the map is closed by the time the run ends
        while True:
            rollup = {line.split()[0]: int(line.split()[1]) for line in Path("/proc/self/smaps_rollup").read_text()
                      .splitlines()[1:]}  # fmt: skip
            for key, value in (("anonymous_kib", rollup["Anonymous:"]), ("pss_kib", rollup["Pss:"]),
                               ("corpus_kib", corpus_resident_kib())):  # fmt: skip
                peaks[key] = max(peaks[key], value)
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()

    def report_then_exit(code: int) -> None:
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
        figures = {"peak_kib": int(status["VmHWM"].split()[0]), **peaks}
        (run_dir / f"memory_rank_{os.environ['RANK']}.json").write_text(json.dumps(figures))
        ending(code)

    train.exit_now = report_then_exit  # train.main ends through it: no interpreter teardown to wait for
    sys.argv = ["train.py", *overrides]
    train.main()


def corpus_resident_kib() -> int:
    """The resident pages of this process's maps of token files (*.bin): the corpus it holds in memory
    as file pages (the page cache's, counted in a container's memory, and reclaimable)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
            inside = head[-1].endswith(".bin")
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


def make_corpora(size_gb: float, scratch: Path, copies_too: bool = True) -> tuple[Path, Path, int]:
    """The stdlib's sources repeated to `size_gb`: token files, and a folder of hard-linked copies."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    from {{cookiecutter.package_name}}.datasets import stdlib_sources

    sources = stdlib_sources()
    repeat = math.ceil(size_gb * GB / sum(path.stat().st_size for path in sources))
    tokens, copies = scratch / f"tokens_{size_gb}GB", scratch / f"copies_{size_gb}GB"
    command = [sys.executable, "-m", f"{package.__name__}.datasets.prepare", "tokens", "stdlib", str(tokens),
               f"--repeat={repeat}", "--force"]  # fmt: skip
    subprocess.run(command, cwd=PROJECT_DIR, check=True, stdout=subprocess.DEVNULL)
    shutil.rmtree(copies, ignore_errors=True)
    # copy_000/... sorts before copy_001/...: the files in --repeat's order
    for copy in range(repeat if copies_too else 0):
        for path in sources:
            target = copies / f"copy_{copy:03d}" / path.relative_to(stdlib)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:  # another file system: a link by name reads the same bytes
                target.symlink_to(path)
    return tokens, copies, repeat


def drop_from_page_cache(folder: Path) -> None:
    """The folder's files out of the page cache (written back first): the job reads them from disk, as
    on a node that did not prepare them, so what its ranks read shows in what they hold."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_job(data: str, root: Path, args: argparse.Namespace, run_dir: Path) -> dict:
    """One torchrun job on `data`; each rank's memory, the job's samples/s and its wall time."""
    if data == "tokens":
        drop_from_page_cache(root)
    overrides = ["task=language_model", f"data={data}", f"data.root={root}", f"data.batch_size={args.batch}",
                 f"data.train_samples={args.batch * args.nproc * args.steps}", "data.val_samples=48",
                 "model.layers=2", "model.width=64", "model.heads=2", "trainer.epochs=1",
                 "trainer.log_every_n_steps=10", "checkpoint.every_n_steps=0", f"hydra.run.dir={run_dir}"]  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               __file__, "--worker", *overrides]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    started = time.monotonic()
    proc = subprocess.run(command, cwd=PROJECT_DIR, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"data={data} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    speeds = [record["samples_per_s"] for record in records if record["kind"] == "train"]
    ranks = [json.loads((run_dir / f"memory_rank_{rank}.json").read_text()) for rank in range(args.nproc)]
    return {"data": data, "ranks": ranks, "samples_per_s": statistics.median(speeds[1:] or speeds), "seconds": seconds}


def main() -> int:
    args = parse_args()
    if args.worker:
        worker()
        return 0
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="text_memory_"))
    scratch.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for size_gb in (float(size) for size in args.sizes.split(",")):
            tokens, copies, repeat = make_corpora(size_gb, scratch, "text" in args.data.split(","))
            meta = json.loads((tokens / "meta.json").read_text())
            corpus_bytes = meta["train_tokens"] + meta["val_tokens"]
            for data, root in (("text", copies), ("tokens", tokens)):
                if data not in args.data.split(","):
                    continue
                row = run_job(data, root, args, scratch / f"run_{data}_{size_gb}GB")
                rows.append({**row, "corpus_gb": corpus_bytes / GB, "repeat": repeat})
            if not args.keep:
                for folder in (tokens, copies):
                    shutil.rmtree(folder, ignore_errors=True)
    finally:
        if not args.keep and not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"tiny GPT (2 layers, width 64), {args.nproc} CPU processes, {args.steps} steps of {args.batch} windows "
          "a process (one epoch); each rank's peaks over the run, in MiB: resident (VmHWM), its own memory "
          "(anonymous), PSS, and the corpus's file pages resident in its maps (sampled every 0.2 s)")  # fmt: skip
    ranks = " ".join(f"{f'rank {rank} peak/anon/pss/corpus':>28}" for rank in range(args.nproc))
    print(f"{'corpus GB':>9} {'data':<7} {ranks} {'samples/s':>10} {'job s':>6}")
    for row in rows:
        ranks = " ".join(
            f"{'/'.join(str(rank[key] // 1024) for key in ('peak_kib', 'anonymous_kib', 'pss_kib', 'corpus_kib')):>28}"
            for rank in row["ranks"]
        )
        print(f"{row['corpus_gb']:>9.2f} {row['data']:<7} {ranks} {row['samples_per_s']:>10.0f} {row['seconds']:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
