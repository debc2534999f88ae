"""models.py: the project's own models' shapes, the GPT's causal attention, parameter counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.models import GPT, SmallCNN, count_parameters


@pytest.mark.parametrize(("height", "width"), [(32, 32), (20, 24), (64, 48)])
def test_the_small_cnn_gives_one_logit_per_class_for_images_of_any_size(height: int, width: int) -> None:
    model = SmallCNN(num_classes=7, width=8).eval()
    assert model(torch.randn(5, 3, height, width)).shape == (5, 7)


def test_the_small_cnn_has_the_parameters_of_three_conv_blocks_and_a_head() -> None:
    # conv 3->32, 32->64, 64->128 (3x3, no bias) with their BatchNorm scales and shifts, then 128->10
    expected = (3 * 32 + 32 * 64 + 64 * 128) * 9 + 2 * (32 + 64 + 128) + 128 * 10 + 10
    assert count_parameters(SmallCNN(num_classes=10)) == expected == 94762


def test_count_parameters_counts_each_shared_parameter_once() -> None:
    shared = nn.Linear(3, 4)  # 12 weights and 4 biases
    assert count_parameters(nn.Sequential(shared, nn.ReLU(), nn.Linear(4, 2))) == 16 + 10
    assert count_parameters(nn.Sequential(shared, shared)) == 16


@pytest.mark.parametrize("length", [1, 5, 16])
def test_the_gpt_gives_next_token_logits_at_every_position(length: int) -> None:
    model = GPT(block_size=16, vocab_size=50, layers=2, heads=2, width=16).eval()
    tokens = torch.randint(0, 50, (3, length))
    assert model(tokens).shape == (3, length, 50)


def test_the_gpt_is_causal_a_later_token_changes_no_earlier_output() -> None:
    torch.manual_seed(0)
    model = GPT(block_size=12, layers=2, heads=4, width=32).eval()
    tokens = torch.randint(0, 256, (2, 12))
    changed = tokens.clone()
    changed[:, 8] = (tokens[:, 8] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(after[:, :8], before[:, :8], rtol=0, atol=1e-6)
    assert (after[:, 8:] - before[:, 8:]).abs().amax(dim=-1).min() > 1e-4, "the token and those after it see it"


def test_the_gpt_sees_the_position_of_each_token() -> None:
    torch.manual_seed(0)
    model = GPT(block_size=8, layers=1, heads=2, width=16).eval()
    with torch.no_grad():
        logits = model(torch.full((1, 8), 65))
    assert not torch.allclose(logits[0, 1], logits[0, 2]), "the same token at two positions, two outputs"


def test_a_gpt_whose_width_is_not_a_multiple_of_its_heads_is_refused() -> None:
    with pytest.raises(ValueError, match="width=30 is not a multiple of heads=4"):
        GPT(block_size=8, width=30, heads=4)


def test_the_gpt_is_byte_level_by_default() -> None:
    model = GPT(block_size=4)
    assert model.token_embedding.num_embeddings == 256 and model.head.out_features == 256
    assert len(model.blocks) == 4 and model.token_embedding.embedding_dim == 128
