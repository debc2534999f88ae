"""A small GPT-style causal transformer over bytes (or a BPE's tokens): the language model's
(`model=gpt`; configs and checkpoints name it `models.GPT`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import count_parameters


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


BUILDABLE = (GPT,)
