"""strategy=hsdp as users launch it: two run_multi.sh nodes of 2 processes each on this machine, the
mesh taken from NNODES x NPROC_PER_NODE; one node SIGKILLed and launched again, the job resumes from a
checkpoint both nodes saved, and ends its last step and validation. That resume bit for
bit against the uninterrupted run, on four ranks as two nodes, and the checkpoint continued under fsdp,
and fsdp's under hsdp on one node of four: in-process, tests/engine/strategies/test_hsdp.py. (It was
checked here against a one-node job of 4 processes: a 4-process job's start, for what in-process shows.)"""

from __future__ import annotations

import math
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
# Elastic: a node may be launched again; the killed one is dropped 6 s after its last heartbeat, not 15.
TWO_NODES = ["NNODES=2:2", "NPROC_PER_NODE=2", "MAX_RESTARTS=2", "RDZV_HEARTBEAT_S=2"]
LAST = 16


def last_val(run_dir: Path) -> dict:
    return [record for record in read_metrics(run_dir) if record["kind"] == "val"][-1]


def test_two_nodes_train_and_resume_after_a_node_is_killed() -> None:
    # Two nodes; one dies (launcher, torchrun, workers at once) after the step-4 checkpoint; launched again,
    # it rejoins, node 0's torchrun restarts its workers, and all resume from the newest checkpoint.
    run_name = f"hsdp_killed_{uuid.uuid4().hex[:6]}"
    killed = PROJECT_DIR / "outputs" / run_name
    try:
        port = free_port()
        args = [*TWO_NODES, f"RUN_NAME={run_name}", *HSDP]
        first, second = node(0, port, *args), node(1, port, *args)
        wait_for_file("checkpoints/step_00000004", killed)
        kill_node(second)
        finish_nodes(first, node(1, port, *args))
        resumed = (killed / "logs" / "rank_0.log").read_text()
        assert "hsdp: " in resumed and "over 2 ranks, replicated 2 times" in resumed, resumed[-3000:]
        assert re.search(r"resumed from \S+/step_000000(04|08|12)\b", resumed), resumed[-3000:]
        assert checkpoint_of(killed, LAST).is_dir(), "hsdp writes fsdp's sharded folders"
        assert set(fingerprints(killed)) == {"rank_0"}, "the weights gathered whole on rank 0, hashed at the end"
        assert last_val(killed)["step"] == LAST and math.isfinite(last_val(killed)["val_loss"])
    finally:
        shutil.rmtree(killed, ignore_errors=True)
