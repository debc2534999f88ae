"""engine/assembly/activation.py: the repeated blocks recompute their activations in the backward: the same loss
and gradients, fewer tensors kept for the backward, the same parameter names; none to find is one line."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.config.strategies import BLOCKS
from {{cookiecutter.package_name}}.engine.assembly.activation import checkpoint_activations
from {{cookiecutter.package_name}}.models import SmallCNN

from ...helpers import STRATEGIES


class Block(nn.Module):
    """A residual MLP block with dropout, as a transformer's repeats its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(4 * width, width))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


class Blocks(nn.Module):
    """An image classifier of three repeated blocks in a ModuleList (8x8 images): what recomputation finds."""

    def __init__(self, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, width))
        self.blocks = nn.ModuleList(Block(width) for _ in range(3))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def fresh_blocks() -> Blocks:
    torch.manual_seed(0)
    return Blocks()


def loss_grads_and_saved(model: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """The loss of one batch, every gradient, and the bytes of the tensors the forward kept for the backward."""
    saved: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    generator = torch.Generator().manual_seed(1)
    images, labels = torch.randn(16, 3, 8, 8, generator=generator), torch.randint(0, 10, (16,), generator=generator)
    torch.manual_seed(2)  # dropout's draws, replayed by the recomputation
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], sum(saved.values())


def test_recomputed_blocks_give_the_same_loss_and_gradients_and_keep_less() -> None:
    plain, recomputed = fresh_blocks(), fresh_blocks()
    names = [name for name, _ in plain.named_parameters()]
    blocks = checkpoint_activations(recomputed, [])
    assert len(blocks) == 3 and [name for name, _ in recomputed.named_parameters()] == names
    loss, grads, kept = loss_grads_and_saved(plain)
    loss_ac, grads_ac, kept_ac = loss_grads_and_saved(recomputed)
    assert torch.allclose(loss, loss_ac, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, grads_ac, strict=True))
    assert kept_ac < 0.6 * kept, f"{kept_ac} bytes kept for the backward against {kept}"


def test_a_model_without_repeated_blocks_is_refused_in_one_line() -> None:
    name_them = rf"name their classes in {re.escape(BLOCKS)}=\[...\], or drop it" if BLOCKS else "drop it"
    with pytest.raises(ConfigError, match=rf"SmallCNN has no repeated blocks to recompute \(.*\): {name_them}$"):
        checkpoint_activations(SmallCNN(num_classes=3), [], BLOCKS)
    assert len(checkpoint_activations(SmallCNN(num_classes=3), ["Sequential"])) == 3, "named classes are found"


def one_step(env, tmp_path, strategy: str) -> dict:
    """One optimizer step of the blocks' model under `strategy`, with and without recomputation."""
    from {{cookiecutter.package_name}}.config import to_train_config
    from {{cookiecutter.package_name}}.engine.assembly.build import build_trainer

    from ...helpers import compose_config

    ends = {}
    for recompute in (False, True):
        overrides = ["model=small_cnn", f"model._target_={__name__}.Blocks", "data=synthetic", "data.image_size=8",
                     "data.train_size=32", "data.val_size=8", "data.batch_size=4", f"strategy={strategy}",
                     f"trainer.activation_checkpointing={recompute}"]  # fmt: skip
        run = build_trainer(to_train_config(compose_config(overrides)), env, tmp_path / f"{strategy}_{recompute}")
        inputs, targets, weights, _ = next(iter(run.data.train_loader))
        torch.manual_seed(3)  # the same dropout draws in both
        loss = run.runner.micro_step(inputs, targets, weights, real_samples=2 * len(inputs), sync=True)
        run.runner.optimizer_step()
        ends[recompute] = (loss.item(), {k: v.clone() for k, v in run.strategy.full_weights().items()})
    return ends


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_under_each_strategy_a_step_with_recomputation_is_the_step_without(tmp_path, strategy: str) -> None:
    from ...helpers import on_ranks

    ends = on_ranks(2, one_step, tmp_path, strategy)[0]
    assert ends[True][0] == pytest.approx(ends[False][0], abs=1e-6)
    assert ends[True][1].keys() == ends[False][1].keys()
    assert all(torch.allclose(ends[True][1][k], ends[False][1][k], atol=1e-6) for k in ends[False][1])
