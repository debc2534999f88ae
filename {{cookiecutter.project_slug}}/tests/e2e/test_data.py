"""A data set that fails in the middle of a real job: it stops once, naming the item."""

from __future__ import annotations

import numpy as np
import pytest

from ..helpers import run


@pytest.mark.slow
def test_a_truncated_jpeg_met_mid_epoch_stops_the_job_once_naming_the_file(tmp_path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in range(2):
            folder = tmp_path / "images" / split / f"class_{label}"
            folder.mkdir(parents=True)
            for i in range(8):
                pixels = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=95)
    broken = tmp_path / "images" / "train" / "class_0" / "3.jpg"  # neither the first nor the last item
    broken.write_bytes(broken.read_bytes()[:300])
    run_dir = tmp_path / "run"
    data = ["data=image_folder", f"data.root={tmp_path / 'images'}", "data.num_classes=2", "data.image_size=16",
            "data.num_workers=1", "data.batch_size=4"]  # fmt: skip
    proc = run(["bash", "scripts/run_single.sh", "NPROC_PER_NODE=2", f"RUN_DIR={run_dir}", "model=small_cnn", *data,
                "trainer.epochs=1"], expect_ok=False, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: data set item 3") and str(broken) in last and "truncated" in last, last
    assert "Traceback" not in proc.stdout + proc.stderr, "the traceback goes to the rank's log file"
    logs = "".join(path.read_text() for path in (run_dir / "logs").glob("rank_*.log"))
    assert "Traceback" in logs and logs.count("run dir:") == 2, "one start per rank: torchrun restarted nobody"
