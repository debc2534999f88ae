"""Shards in an object store (moto's S3 server on 127.0.0.1), trained on by a torchrun job that is killed
mid-epoch and launched again on an emptied cache: the steps redone are bit-identical, every sample is seen
once per epoch, and the store's secret is in no file of the run. Images here; text shards (the language
model's windows) streamed from the same server through a bounded cache, every window of an epoch the same
as its local copy: tests/datasets/test_shards.py, in-process (the shard sampler and the cache are the same
for every kind)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from {{cookiecutter.package_name}}.datasets.prepare import main as prepare

from ..helpers import write_image_tree
from .jobs import assert_bit_identical, finish, samples_per_epoch, set_aside_after, start, steps_saved, wait_for

pytestmark = pytest.mark.slow

# 64 training samples in shards of 8: 8 steps of 2 x 4 an epoch, read 2 shards at a time through a cache
# that holds 3 of them on the node, a checkpoint every 3 steps.
COMMON = ["data=shards", "data.batch_size=4", "data.shard_window=2", "trainer.epochs=2", "trainer.record_samples=true",
          "checkpoint.every_n_steps=3", "checkpoint.keep_last=20", "trainer.log_every_n_steps=4"]  # fmt: skip


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it: torchrun's workers run in sessions of their own."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *(found for child in children for found in process_tree(int(child)))]


def killed_and_resumed_on_an_empty_cache(run_dir: Path, cache: Path, job: list[str]) -> None:
    """The job killed (SIGKILL, every process at once) past its second checkpoint, mid-epoch; the
    checkpoints after the first set aside and the node's cache removed; launched again, it redoes
    those steps from the first checkpoint: they must be bit-identical."""
    proc = start(run_dir, 2, *job, max_restarts=0)
    wait_for(lambda: 6 in steps_saved(run_dir), "the checkpoint of step 6")
    for pid in process_tree(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    aside, redone = set_aside_after(run_dir, 3)
    assert cache.is_dir() and any(cache.rglob("*.pt")), "the first launch cached shards"
    shutil.rmtree(cache)
    code, output = finish(start(run_dir, 2, *job))
    assert code == 0, output[-3000:]
    assert re.search(r"resumed from \S*step_00000003\.pt", output), output[-3000:]
    assert any(cache.rglob("*.pt")), "the second launch fetched the shards again"
    for step in redone:
        assert_bit_identical(aside, run_dir, step)


IMAGES = ["task=classification", "model=small_cnn", "data.num_classes=2", "data.num_workers=0"]
SAMPLES = 64


def test_image_shards_in_a_store_resume_bit_exactly_on_an_empty_cache(tmp_path: Path, s3_server) -> None:
    bucket = s3_server.bucket()
    images = write_image_tree(tmp_path / "images", 2, 32, 8, (8, 8))
    assert prepare(["shards", str(images), f"{bucket}/images", "--kind", "images", "--image-size", "8",
                    "--samples-per-shard", "8"]) == 0  # fmt: skip
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    index = json.loads(s3_server.filesystem().cat_file(f"{bucket[5:]}/images/index.json"))
    limit = 3 * max(shard["bytes"] for shard in index["splits"]["train"]) / 1e9  # shards evicted as it goes
    job = [*IMAGES, *COMMON, f"data.root={bucket}/images", f"data.cache_dir={cache}", f"data.cache_limit_gb={limit}"]
    killed_and_resumed_on_an_empty_cache(run_dir, cache, job)
    shards = len(index["splits"]["train"]) + len(index["splits"]["val"])
    assert len(list(cache.rglob("[!.]*.pt"))) < shards, "the cache never holds the whole data set"
    seen = samples_per_epoch(run_dir)
    assert sorted(seen) == [0, 1], seen.keys()
    for epoch in seen:
        assert sorted(seen[epoch]) == list(range(SAMPLES)), f"each sample once in epoch {epoch}"
    for path in [*run_dir.rglob("*"), *cache.rglob("*")]:
        if path.is_file():
            assert s3_server.secret.encode() not in path.read_bytes(), f"the store's secret is in {path}"
