"""engine/blocks.py: the blocks that activation checkpointing recomputes and a sharding strategy shards
one by one (tests/engine/assembly/test_activation.py and the strategies' tests use them)."""

from __future__ import annotations

import pytest
import torchvision
from torch import nn

from {{cookiecutter.package_name}}.common.errors import ConfigError
from {{cookiecutter.package_name}}.engine.blocks import find_blocks
from {{cookiecutter.package_name}}.models import SmallCNN


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)


class Stack(nn.Module):
    """A transformer's shape: repeated blocks in a ModuleList, and modules around them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.blocks, self.head = nn.Linear(4, 4), nn.ModuleList(Block() for _ in range(3)), nn.Linear(4, 2)


def test_the_blocks_are_the_repeated_units_or_the_named_classes() -> None:
    stack = Stack()
    assert find_blocks(stack, []) == list(stack.blocks)
    resnet = torchvision.models.resnet18()
    assert find_blocks(resnet, []) == [resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4]
    assert len(find_blocks(resnet, ["BasicBlock"])) == 8
    assert find_blocks(SmallCNN(num_classes=3), []) == []  # the root only
    with pytest.raises(ConfigError) as error:  # a typo would shard nothing block by block: the whole model at once
        find_blocks(stack, ["Blok"])
    assert str(error.value).startswith("blocks=['Blok'] names no class Stack has: name its repeated blocks' ")
    assert "(it has Block, " in str(error.value)
    assert find_blocks(stack, ["Block", "Bottleneck"]) == list(stack.blocks), "a list for several models"
