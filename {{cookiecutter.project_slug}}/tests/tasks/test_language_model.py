"""tasks/language_model.py: the language model's loss (a (total, count) pair over the real tokens), its
bits per byte, its predictions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from {{cookiecutter.package_name}}.tasks import Task
from {{cookiecutter.package_name}}.tasks.language_model import LanguageModel


def test_the_language_model_loss_is_the_next_token_cross_entropy_summed_over_the_real_tokens_and_their_count() -> None:
    generator = torch.Generator().manual_seed(1)
    logits, tokens = torch.randn(3, 7, 11, generator=generator), torch.randint(0, 11, (3, 7), generator=generator)
    total, count = LanguageModel().loss(logits, tokens)
    assert total.shape == () and count == 21
    expected = F.cross_entropy(logits.flatten(0, 1), tokens.flatten(), reduction="sum")
    assert total.item() == pytest.approx(expected.item())
    tokens[2, 3:] = -100  # padding (pad_windows): neither scored nor counted
    total, count = LanguageModel().loss(logits, tokens)
    real = tokens != -100
    expected = F.cross_entropy(logits[real], tokens[real], reduction="sum")
    assert count == 17 and total.item() == pytest.approx(expected.item())


def test_the_language_models_bits_per_byte_are_its_loss_in_bits() -> None:
    generator = torch.Generator().manual_seed(2)
    logits, tokens = torch.randn(4, 5, 256, generator=generator), torch.randint(0, 256, (4, 5), generator=generator)
    metrics = LanguageModel().metrics(logits, tokens)
    assert list(metrics) == ["loss", "bpb"]
    total, count = metrics["loss"]
    torch.testing.assert_close(total.float(), LanguageModel().loss(logits, tokens)[0])
    assert count == 20
    torch.testing.assert_close(metrics["bpb"][0], total / math.log(2), rtol=0, atol=0)
    assert metrics["bpb"][1] == count
    uniform, count = LanguageModel().metrics(torch.zeros(1, 5, 256), tokens[:1])["bpb"]
    assert (uniform / count).item() == pytest.approx(8.0), "a uniform guess over 256 bytes costs 8 bits a byte"


def test_the_language_model_is_a_task_whose_half_precision_loss_is_computed_in_float32() -> None:
    assert isinstance(LanguageModel(), Task)
    generator = torch.Generator().manual_seed(0)
    logits, tokens = torch.randn(2, 3, 5, generator=generator), torch.randint(0, 5, (2, 3), generator=generator)
    for dtype in (torch.float16, torch.bfloat16):
        half = logits.to(dtype)
        (total, count), (expected, _) = LanguageModel().loss(half, tokens), LanguageModel().loss(half.float(), tokens)
        assert total.dtype == torch.float32 and torch.equal(total, expected) and count == 6


def test_the_language_models_predictions_are_its_logits_their_softmax_or_the_likeliest_token() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    task = LanguageModel()
    assert task.predictions == ("logits", "probs", "token")  # the first: predict.py's default
    assert task.predict(logits, "logits") is logits
    assert torch.equal(task.predict(logits, "probs"), torch.softmax(logits, dim=-1))
    assert torch.equal(task.predict(logits, "token"), logits.argmax(dim=-1))
