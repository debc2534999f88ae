"""observe/figures.py: the log line's peak memory, tokens/s and MFU, from what the task and model say.
Their place in metrics.jsonl: tests/engine/test_trainer.py; in the other sinks: tests/observe/sinks/."""

from __future__ import annotations

import types

import pytest
import torch

from {{cookiecutter.package_name}}.models import GPT, SmallCNN
from {{cookiecutter.package_name}}.observe.figures import Throughput, peak_flops, peak_memory_mb
from {{cookiecutter.package_name}}.tasks import Classification, LanguageModel

CPU_ENV = types.SimpleNamespace(device=torch.device("cpu"), world_size=2)


def test_on_cpus_the_peak_memory_is_the_resident_sets_and_there_is_no_mfu() -> None:
    held = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB resident
    assert peak_memory_mb(torch.device("cpu")) > 64
    del held
    assert peak_flops(torch.device("cpu")) is None


def test_a_language_model_counts_tokens_and_an_image_task_does_not() -> None:
    lm = Throughput()
    lm.count_tokens(LanguageModel(), torch.zeros(4, 16, dtype=torch.long), GPT(block_size=16, width=32, layers=2))
    figures = lm.figures(10.0, CPU_ENV)
    assert figures["tokens_per_s"] == 160.0 and "mfu" not in figures  # no peak FLOPs known on a CPU
    lm.peak = 1e12  # a GPU the table knows
    assert lm.figures(10.0, CPU_ENV)["mfu"] == pytest.approx(160.0 * lm.flops_per_token / (2 * 1e12))

    images = Throughput()
    images.count_tokens(Classification(), torch.zeros(4, dtype=torch.long), SmallCNN(10))
    assert images.tokens_per_sample == 0 and set(images.figures(10.0, CPU_ENV)) == {"peak_memory_mb"}
