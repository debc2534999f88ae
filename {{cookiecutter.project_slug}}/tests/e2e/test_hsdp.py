"""strategy=hsdp as users launch it: two run_multi.sh nodes of 2 processes each on this machine, the
mesh taken from NNODES x NPROC_PER_NODE; one node SIGKILLed and launched again, the job resumes
bit-identically. Its checkpoint continued under fsdp, and fsdp's under hsdp: in-process on four ranks,
tests/engine/strategies/test_hsdp.py."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import pytest

from ..helpers import PROJECT_DIR, SMALL, free_port
from .jobs import checkpoint_of, fingerprints, finish_nodes, kill_node, node, read_metrics, wait_for_file

pytestmark = pytest.mark.slow

# small_cnn (the default model, with BatchNorm buffers): 4 processes x 16 samples, 8 steps an epoch, 16 in all.
HSDP = [*SMALL, "strategy=hsdp", "data.train_size=512", "data.val_size=200", "data.batch_size=16",
        "trainer.epochs=2", "checkpoint.every_n_steps=4", "checkpoint.keep_last=10"]  # fmt: skip
TWO_NODES = ["NNODES=2:2", "NPROC_PER_NODE=2", "MAX_RESTARTS=2"]  # elastic: a node may be launched again
LAST = 16


def last_val(run_dir: Path) -> dict:
    return [record for record in read_metrics(run_dir) if record["kind"] == "val"][-1]


def test_two_nodes_train_and_resume_after_a_node_is_killed() -> None:
    names = {name: f"hsdp_{name}_{uuid.uuid4().hex[:6]}" for name in ("reference", "killed")}
    dirs = {name: PROJECT_DIR / "outputs" / run_name for name, run_name in names.items()}
    try:
        port = free_port()
        args = [*TWO_NODES, f"RUN_NAME={names['reference']}", *HSDP]
        finish_nodes(node(0, port, *args), node(1, port, *args))
        reference = dirs["reference"]
        log = (reference / "logs" / "rank_0.log").read_text()
        assert "hsdp: " in log and "over 2 ranks, replicated 2 times" in log, log[-3000:]
        assert checkpoint_of(reference, LAST).is_dir(), "hsdp writes fsdp's sharded folders"

        # A node dies (launcher, torchrun, workers at once) after the step-4 checkpoint; launched again,
        # it rejoins, node 0's torchrun restarts its workers, and all resume from the newest checkpoint.
        port = free_port()
        args = [*TWO_NODES, f"RUN_NAME={names['killed']}", *HSDP]
        first, second = node(0, port, *args), node(1, port, *args)
        wait_for_file("checkpoints/step_00000004", dirs["killed"])
        kill_node(second)
        finish_nodes(first, node(1, port, *args))
        resumed = (dirs["killed"] / "logs" / "rank_0.log").read_text()
        assert re.search(r"resumed from \S+/step_000000(04|08|12)\b", resumed), resumed[-3000:]
        assert fingerprints(dirs["killed"])["rank_0"] == fingerprints(reference)["rank_0"], "bit-identical weights"
        assert last_val(dirs["killed"]) == last_val(reference)

    finally:
        for run_dir in dirs.values():
            shutil.rmtree(run_dir, ignore_errors=True)
