"""The project's own models: a small CNN for quick image runs and a small GPT over bytes.

Any other model is a `configs/model/*.yaml` file whose `_target_` returns an nn.Module
(torchvision's by `_target_: torchvision.models.resnet18`, a user's own by its import path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Sequential):
    """Three conv blocks, global pooling and a linear head: trains in seconds on CPUs."""

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__(
            conv_block(3, width),
            nn.MaxPool2d(2),
            conv_block(width, 2 * width),
            nn.MaxPool2d(2),
            conv_block(2 * width, 4 * width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4 * width, num_classes),
        )


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (
            part.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
            for part in self.qkv(x).split(width, dim=2)
        )
        # Fused attention (flash or memory-efficient kernels on GPUs).
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.proj_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, width)))


class Block(nn.Module):
    """Pre-norm transformer block: attention, then an MLP, each added to the residual stream."""

    def __init__(self, width: int, heads: int, dropout: float, gelu: str | None = None) -> None:
        super().__init__()
        self.attention_norm, self.mlp_norm = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads, dropout)
        approximate = "tanh" if gelu == "tanh" else "none"  # tanh: GPT-2's gelu_new
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(approximate), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """A small GPT-style causal transformer; over bytes by default (vocabulary 256, no tokenizer)."""

    def __init__(
        self, block_size: int, vocab_size: int = 256, layers: int = 4, heads: int = 4, width: int = 128,
        dropout: float = 0.0, gelu: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        if width % heads:
            raise ValueError(f"width={width} is not a multiple of heads={heads}")
        if gelu not in (None, "exact", "tanh"):  # None: exact
            raise ValueError(f"gelu={gelu}: give exact or tanh (GPT-2's approximation)")
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(block_size, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, gelu) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward and backward) per token: 6 per parameter, and attention's 12 per layer,
        width and position (PaLM's appendix B); the log line's MFU (observe/figures.py)."""
        layers, width = len(self.blocks), self.head.in_features
        return 6 * count_parameters(self) + 12 * layers * width * seq_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of the next token at every position: (batch, length, vocab_size)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class MixtureOfExperts(nn.Module):
    """An example of a model that returns (logits, aux): a classifier of flattened inputs through `experts`
    MLPs mixed by a softmax gate, and the gate's load-balance term (1 where every expert is used
    equally, up to `experts` where one takes everything: experts times the sum of the squared mean
    gate weights), which tasks.ClassificationWithAux adds to the loss."""

    def __init__(self, in_features: int, num_classes: int, experts: int = 4, width: int = 64) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.gate = nn.Linear(in_features, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, width)) for _ in range(experts)
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.flatten(x)
        gates = self.gate(x).softmax(dim=-1)  # (batch, experts)
        mixed = sum(gates[:, i, None] * expert(x) for i, expert in enumerate(self.experts))
        balance = len(self.experts) * gates.mean(dim=0).square().sum()
        return self.head(torch.relu(mixed)), balance


def count_parameters(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


# What a checkpoint's config may build (engine/checkpoint/trust.py): a model of yours here, named by no config
# file, is added to it; anything of the package not listed is refused.
BUILDABLE = (SmallCNN, GPT, MixtureOfExperts)
