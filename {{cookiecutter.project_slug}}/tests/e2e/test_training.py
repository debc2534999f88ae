"""Real torchrun jobs on CPU with gloo: training learns, logs per rank and evaluates exactly; the shared job is
also checked by the modules beside this file that name SHARED_RUN_OVERRIDES (a capability's own)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from ..helpers import PYTHON, SMALL, run
from .jobs import last_line, read_metrics, torchrun

pytestmark = pytest.mark.slow

# The modules beside this file that add overrides to the shared job and check it (SHARED_RUN_OVERRIDES and
# check_shared_run(run_dir, output)): each a capability's own, which a project made without it lacks.
SHARED_CHECKS = [
    importlib.import_module(f"{__package__}.{path.stem}")
    for path in sorted(Path(__file__).parent.glob("*.py"))
    if re.search(r"^SHARED_RUN_OVERRIDES = ", path.read_text(), re.MULTILINE)
]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> tuple[Path, str]:
    """One two-process job started the way a user starts it: scripts/run_single.sh."""
    run_dir = tmp_path_factory.mktemp("run") / "job"
    proc = run(
        [
            "bash",
            "scripts/run_single.sh",
            "NPROC_PER_NODE=2",
            f"RUN_DIR={run_dir}",
            *SMALL,
            "trainer.epochs=5",
            "data.train_size=2048",
            *(override for checks in SHARED_CHECKS for override in checks.SHARED_RUN_OVERRIDES),
        ]
    )
    return run_dir, proc.stdout + proc.stderr


def test_two_processes_learn(trained_run) -> None:
    run_dir, output = trained_run
    final = [m for m in read_metrics(run_dir) if m["kind"] == "val"][-1]
    assert final["val_acc"] > 0.8, final
    assert final["val_samples"] == 251
    assert f"run dir: {run_dir}" in output
    assert "world size 2" in output


def test_rank_logs_metrics_and_config_are_left(trained_run) -> None:
    run_dir, _ = trained_run
    for rank in (0, 1):
        text = (run_dir / "logs" / f"rank_{rank}.log").read_text()
        assert f"[rank={rank} " in text
    assert "train_loss" in (run_dir / "logs" / "rank_0.log").read_text()
    records = read_metrics(run_dir)
    train = [r for r in records if r["kind"] == "train"]
    assert train and set(train[0]) == {
        "kind",
        "step",
        "epoch",
        "train_loss",
        "lr",
        "samples_per_s",
        "grad_norm",
        "peak_memory_mb",
    }
    val = [r for r in records if r["kind"] == "val"]
    assert [r["epoch"] for r in val] == [0, 1, 2, 3, 4]
    assert set(val[0]) == {"kind", "step", "epoch", "val_loss", "val_acc", "val_macro_f1", "val_samples"}
    matrices = [json.loads(line) for line in (run_dir / "val_confusion_matrix.jsonl").read_text().splitlines()]
    assert [m["step"] for m in matrices] == [r["step"] for r in val], "one confusion matrix per validation"
    assert sum(map(sum, matrices[-1]["val_confusion_matrix"])) == val[-1]["val_samples"], "every sample once"
    assert (run_dir / "checkpoints" / "config.yaml").is_file()
    assert (run_dir / ".hydra" / "config.yaml").is_file()


@pytest.mark.parametrize("checks", SHARED_CHECKS, ids=lambda checks: checks.__name__.rsplit(".", 1)[-1])
def test_the_shared_job_as_the_capabilities_beside_this_file_check_it(trained_run, checks) -> None:
    checks.check_shared_run(*trained_run)


def test_eval_is_identical_at_world_sizes_2_and_3(trained_run) -> None:
    run_dir, _ = trained_run
    checkpoint = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]
    # 3 processes and another batch size; 2: the training run's own validation, compared below. (1, eval.py as
    # plain python, a world of one: test_collate.py, against the same run's validation on 2.)
    line = last_line(torchrun("eval.py", 3, f"ckpt_path={checkpoint}", "data.batch_size=7").stdout)
    assert line.startswith("val_loss=") and line.endswith("val_samples=251")
    final = [m for m in read_metrics(run_dir) if m["kind"] == "val"][-1]
    assert f"val_acc={final['val_acc']:.6f}" in line and final["val_samples"] == 251
    # (A task the checkpoint's model cannot take, refused in one line: tests/test_eval.py, in-process.)


def test_plot_script_draws_the_run(trained_run) -> None:
    run_dir, _ = trained_run
    proc = run([PYTHON, "scripts/plot_metrics.py", str(run_dir)])
    picture = run_dir / "metrics.png"
    assert proc.stdout.strip() == str(picture)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 20_000
    missing = run([PYTHON, "scripts/plot_metrics.py", str(run_dir / "nope")], expect_ok=False)
    assert (
        missing.returncode != 0 and missing.stderr.strip().startswith("error: ") and "Traceback" not in missing.stderr
    )


# One run dir per job without any run dir given (the agent's run id names it, on every rank): test_launch.py's
# installed package under plain torchrun; torch.distributed.launch's --local-rank argument: tests/test_train.py.


def test_plain_python_runs_as_a_world_of_one(tmp_path) -> None:
    proc = run([PYTHON, "train.py", *SMALL, "trainer.epochs=1", "data.train_size=256", f"hydra.run.dir={tmp_path}"])
    assert "world size 1" in proc.stderr
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["kind"] == "val"
