"""Communication options in real jobs: compression hooks, GPU selection. The backend's choice and its refusals:
tests/common/test_placement.py, in-process."""

from __future__ import annotations

import pytest

from {{cookiecutter.package_name}}.models import SmallCNN

from ..helpers import SMALL, run
from .jobs import read_metrics, torchrun


@pytest.mark.slow
def test_powersgd_trains_on_one_process_per_listed_gpu(tmp_path) -> None:
    # fp16 and bf16 go through the same registration: test_benchmark_gives_one_row_per_hook trains with them.
    # PowerSGD's memory through a checkpoint, resumed bit for bit: tests/engine/distributed/test_comm_hooks.py.
    # GPUS= on a machine without them: one process per listed GPU (CUDA_VISIBLE_DEVICES in each worker:
    # test_launch.py::test_gpus_key_gives_one_process_per_gpu_and_reaches_it_as_cuda_visible_devices).
    proc = run(["bash", "scripts/run_single.sh", "GPUS=0,1,2", f"RUN_DIR={tmp_path}", *SMALL,
                "data.image_size=32", "trainer.epochs=3", "ddp.comm_hook=powersgd",
                "ddp.powersgd_start_iter=4"])  # fmt: skip  # 3 x 11 steps of 3 x 32 samples
    assert "DDP communication hook: powersgd" in proc.stderr
    assert "world size 3" in proc.stderr
    assert {p.name for p in (tmp_path / "logs").iterdir()} == {"rank_0.log", "rank_1.log", "rank_2.log"}
    records = read_metrics(tmp_path)
    losses = [r["train_loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.7 * losses[0], losses
    assert [r for r in records if r["kind"] == "val"][-1]["val_acc"] > 0.3


# dist.backend=mpi where torch lacks it, refused in one line: tests/common/test_placement.py (the pre-flight
# check's refusals through the launch script, exit 2 before torchrun: test_launch.py). The hook settings
# below are refused by the launcher's first check, in a fraction of a second (and in-process:
# tests/config/test_schema.py).
@pytest.mark.slow
@pytest.mark.parametrize("override", ["ddp.comm_hook=int8", "ddp.powersgd_rank=0", "ddp.powersgd_start_iter=1"])
def test_bad_hook_settings_are_refused(override: str) -> None:
    proc = run(["bash", "scripts/run_single.sh", override], expect_ok=False)
    assert proc.returncode == 2 and override.split("=")[0] in proc.stderr


@pytest.mark.slow
def test_benchmark_gives_one_row_per_hook_with_what_it_registered_and_sent() -> None:
    proc = torchrun("benchmarks/comm_hooks.py", 2, "--steps=2", "--warmup=3")
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[-4:]}
    assert set(rows) == {"none", "fp16", "bf16", "powersgd"}, proc.stdout
    registered = {name: values[4] for name, values in rows.items()}
    assert registered == {"none": "-", "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook",
                          "powersgd": "PowerSGDHook.run"}, proc.stdout  # fmt: skip
    dtypes = {name: values[3] for name, values in rows.items()}
    assert dtypes == {"none": "float32", "fp16": "float16", "bf16": "bfloat16", "powersgd": "float32"}, proc.stdout
    sent = {name: int(values[1]) for name, values in rows.items()}
    parameters = 4 * sum(p.numel() for p in SmallCNN(num_classes=10).parameters())  # fp32 gradients, one step
    assert sent["none"] == parameters and sent["fp16"] == sent["bf16"] == parameters // 2, proc.stdout
    assert 0 < sent["powersgd"] < sent["fp16"], proc.stdout
    assert all(float(values[0]) > 0 for values in rows.values())
