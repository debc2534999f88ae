"""models/gpt.py: the GPT's shapes, its causal attention, its positions."""

from __future__ import annotations

import pytest
import torch

from {{cookiecutter.package_name}}.models.gpt import GPT


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


def test_the_gpt_is_found_by_the_names_configs_and_checkpoints_give() -> None:
    from {{cookiecutter.package_name}} import models
    from {{cookiecutter.package_name}}.models import GPT, Block  # what gpt.py defines, as when it was models.py's

    assert Block.__module__ == GPT.__module__ == f"{models.__name__}.gpt" and GPT in models.BUILDABLE
