"""W&B through real jobs whose rank 0 (the trackers' process) is SIGKILLed and restarted by torchrun:
offline, with no API key and nothing of the user's, so nothing leaves the machine; one run id, every
logged step once, read back with W&B's own inspector. Where another tracker's test hosts the trackers' job
(tracker_jobs.hosted), W&B rides on it and is checked the same there: this job is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from .tracker_jobs import hosted, run_and_kill
from .wandb_jobs import assert_one_wandb_run_with_every_step_once, wandb_offline

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(hosted("wandb"), reason="another tracker's job runs W&B beside its own"),
]


def test_wandb_offline_run_keeps_its_id_across_a_restart_with_every_step_once(tmp_path: Path, monkeypatch) -> None:
    wandb_offline(monkeypatch, tmp_path / "wandb_home")
    run_dir = tmp_path / "run"
    assert_one_wandb_run_with_every_step_once(run_dir, run_and_kill(run_dir, "log.wandb=true"))
