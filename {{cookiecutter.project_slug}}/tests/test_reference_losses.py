"""Numbers that stay across commits: the first training losses of tiny runs, one per case of
tests/fixtures/reference_losses.json (each case's overrides and its losses, float.hex, bit for bit), with the
environment they came from. A change that moves them fails here; an intended one regenerates the losses:

    python -m tests.test_reference_losses --write      # from the project root (docs/testing.md)

The cases name their task, model and data, so every bake (whatever its defaults) runs the same ones; a
case with `"tiny": true` starts from tests/helpers.py's TINY, one with `"data_root": "text_files"` reads
ten small text files written for it."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from {{cookiecutter.package_name}}.config import to_train_config
from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

from .helpers import CPU, TINY, compose_config

REFERENCE = Path(__file__).parent / "fixtures" / "reference_losses.json"
STEPS = 8
TOLERANCE = 1e-4  # relative, on another torch, CPU model or thread count: the kernels' sums may round otherwise
WORDS = "the quick brown fox jumps over a lazy dog while seven tired cats watch from the warm wall"


def text_files(root: Path) -> Path:
    """Ten small text files of fixed bytes (the first one validation): not the standard library's sources,
    which change with the Python version."""
    root.mkdir(parents=True)
    words = WORDS.split()
    for number in range(10):
        lines = [" ".join(words[(number * 7 + line * 3 + k) % len(words)] for k in range(9)) for line in range(40)]
        (root / f"part_{number}.txt").write_text("\n".join(lines) + "\n")
    return root


def cases() -> dict[str, dict]:
    return json.loads(REFERENCE.read_text())["cases"]


def losses(case: dict, run_dir: Path) -> list[float]:
    """The case's train_loss of each of its first STEPS steps, as metrics.jsonl holds them."""
    overrides = [*(TINY if case.get("tiny") else []), *case["overrides"], f"trainer.max_steps={STEPS}",
                 "trainer.log_every_n_steps=1"]  # fmt: skip  # TINY: task=classification, small_cnn, synthetic
    if case.get("data_root") == "text_files":
        overrides.append(f"data.root={text_files(run_dir.parent / 'text')}")
    build_trainer(to_train_config(compose_config(overrides)), CPU, run_dir).fit()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [record["train_loss"] for record in records if record["kind"] == "train"]


def environment() -> dict[str, object]:
    """What the bits depend on: torch, the CPU's kind and model, the instruction set torch's kernels use (two
    CPUs both named "AMD EPYC" may differ: AVX2 or AVX512), the thread count (and, for the record, Python)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.is_file() else []  # fmt: skip
    cpu = names[0] if names else platform.processor()
    return {"torch": torch.__version__, "machine": platform.machine(), "cpu": cpu,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "python": platform.python_version()}  # fmt: skip


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the recorded environment's: the same on any machine's core count
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def single_thread() -> Iterator[None]:
    with one_thread():
        yield


def test_the_first_losses_are_the_recorded_ones(tmp_path: Path, single_thread: None) -> None:
    """Bit for bit where torch, the CPU model, its instruction set and the thread count are the recorded ones;
    within TOLERANCE elsewhere. A failure here is a change of the numbers: if intended, regenerate the file
    (module docstring)."""
    reference = json.loads(REFERENCE.read_text())
    recorded, here = reference["environment"], environment()
    same = all(recorded.get(key) == here[key] for key in ("torch", "machine", "cpu", "cpu_capability", "threads"))
    for name, case in reference["cases"].items():
        expected_hex = case["losses"]
        expected = [float.fromhex(value) for value in expected_hex]
        got = losses(case, tmp_path / name)
        where = (f"{name}: the losses moved; the reference came from {recorded}, this run is on {here}"
                 f" ({'the same environment: compared bit for bit' if same else f'compared to rel {TOLERANCE}'});"
                 f" an intended change regenerates it: python -m tests.test_reference_losses --write")  # fmt: skip
        assert len(got) == len(expected) == STEPS, f"{where}: {len(got)} steps logged, {len(expected)} recorded"
        if same:
            assert [value.hex() for value in got] == expected_hex, f"{where}\n got {got}\n expected {expected}"
        else:
            assert got == pytest.approx(expected, rel=TOLERANCE), f"{where}\n got {got}\n expected {expected}"


def write() -> None:
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # as tests/conftest.py sets it for the test that compares
    with one_thread(), tempfile.TemporaryDirectory() as folder:
        recorded = {name: {**case, "losses": [value.hex() for value in losses(case, Path(folder) / name)]}
                    for name, case in cases().items()}  # fmt: skip
        payload = {"regenerate": "python -m tests.test_reference_losses --write", "environment": environment(),
                   "cases": recorded}  # fmt: skip
    REFERENCE.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {REFERENCE}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        print("usage: python -m tests.test_reference_losses --write (records the losses anew)", file=sys.stderr)
        sys.exit(2)
    write()
