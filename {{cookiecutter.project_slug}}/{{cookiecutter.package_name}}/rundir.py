"""How the run dir is chosen: one dir per job, shared by every rank and every restart.

Hydra's usual `outputs/${now:...}` is evaluated in each process, so the ranks of one job
(started a few milliseconds apart) and every torchrun restart would each get a dir of their
own, and a restarted job would not find its checkpoints. The run dir is therefore:

1. `hydra.run.dir=...` when given (the launch scripts always give it);
2. under torchrun, `outputs/torchrun_<TORCHELASTIC_RUN_ID>`: the same for all ranks and all
   restarts (with --standalone the id is a fresh uuid per launch; with --rdzv-id it is yours);
3. without torchrun (`python train.py`), a timestamped dir as usual.
"""

from __future__ import annotations

import os
import time

from omegaconf import OmegaConf

OUTPUT_ROOT = "outputs"


def job_run_dir() -> str:
    """The run dir when none is given: see the module docstring."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return os.path.join(OUTPUT_ROOT, f"torchrun_{run_id}")
    if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Static rendezvous without an id: nothing job-wide to build a name from.
        return os.path.join(OUTPUT_ROOT, "torchrun_job")
    return os.path.join(OUTPUT_ROOT, time.strftime("%Y-%m-%d_%H-%M-%S"))


def rank_zero_only(value: str) -> str | None:
    """`value` on global rank 0, None elsewhere: Hydra's .hydra/ files are written once per job."""
    return value if os.environ.get("RANK", "0") == "0" else None


def register_resolvers() -> None:
    """Register the resolvers that configs/train.yaml uses under `hydra:`."""
    OmegaConf.register_new_resolver("job_run_dir", job_run_dir, replace=True)
    OmegaConf.register_new_resolver("rank_zero_only", rank_zero_only, replace=True)
