"""observe/figures.py: the log line's peak memory, tokens/s and MFU, from what the task and model say.
Their place in metrics.jsonl: tests/engine/test_trainer.py; in the other sinks: tests/observe/sinks/."""

from __future__ import annotations

import types

import torch

from {{cookiecutter.package_name}}.models import SmallCNN
from {{cookiecutter.package_name}}.observe.figures import Throughput, peak_flops, peak_memory_mb
from {{cookiecutter.package_name}}.tasks import Classification

CPU_ENV = types.SimpleNamespace(device=torch.device("cpu"), world_size=2)


def test_on_cpus_the_peak_memory_is_the_resident_sets_and_there_is_no_mfu() -> None:
    held = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB resident
    assert peak_memory_mb(torch.device("cpu")) > 64
    del held
    assert peak_flops(torch.device("cpu")) is None


def test_an_image_task_counts_no_tokens() -> None:
    # A task and model that say their tokens and FLOPs (tokens_per_sample, flops_per_token): their own tests.
    images = Throughput()
    images.count_tokens(Classification(), torch.zeros(4, dtype=torch.long), SmallCNN(10))
    assert images.tokens_per_sample == 0 and set(images.figures(10.0, CPU_ENV)) == {"peak_memory_mb"}
