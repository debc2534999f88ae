"""Randomness that resumes bit-exactly: a sample's draws from its key (seed, epoch, index), known to the
data set while the loader builds the sample, whatever the world size, the workers or a resume in between
(docs/checkpoints.md, "Randomness that resumes exactly")."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from contextvars import ContextVar

import numpy as np
import torch

MASK64 = (1 << 64) - 1
EVAL_EPOCH = -1  # the "epoch" of evaluation samples: their randomness, if any, is fixed


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 64-bit number from (seed, epoch, index): splitmix64's finaliser."""
    x = (seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB + 1) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def as_int64(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned `value`."""
    return value - (1 << 64) if value >= 1 << 63 else value


def shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 tensors that hold unsigned 64-bit patterns."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def sample_seeds(seed: int, epoch: int, indices: torch.Tensor) -> torch.Tensor:
    """`sample_seed` of many indices at once, on their device: int64 tensors of the same bits."""
    base = as_int64((seed * 0x9E3779B97F4A7C15 + epoch * 0xBF58476D1CE4E5B9 + 1) & MASK64)
    x = indices * as_int64(0x94D049BB133111EB) + base  # int64 arithmetic wraps like uint64's
    x = (x ^ shift_right(x, 30)) * as_int64(0xBF58476D1CE4E5B9)
    x = (x ^ shift_right(x, 27)) * as_int64(0x94D049BB133111EB)
    return x ^ shift_right(x, 31)


_current_sample: ContextVar[tuple[int, int, int] | None] = ContextVar("current_sample", default=None)


def current_sample() -> tuple[int, int, int]:
    """(seed, epoch, index) of the sample being built; evaluation samples have epoch -1."""
    key = _current_sample.get()
    if key is None:
        raise RuntimeError("current_sample() is only known while the project's loader builds a sample")
    return key


def sample_generator(device: str | torch.device = "cpu") -> torch.Generator:
    """A torch.Generator seeded from the current sample's key."""
    return torch.Generator(device).manual_seed(sample_seed(*current_sample()) & (MASK64 >> 1))


@contextlib.contextmanager
def building_sample(seed: int, epoch: int, index: int) -> Iterator[None]:
    """Make (seed, epoch, index) the current sample's key while the data set builds it."""
    token = _current_sample.set((seed, epoch, index))
    try:
        yield
    finally:
        _current_sample.reset(token)


@contextlib.contextmanager
def seeded_by_sample() -> Iterator[None]:
    """Inside a data set's __getitem__: torch's, Python's and NumPy's global generators seeded from the
    current sample's key for the block, their states put back afterwards."""
    draw = sample_seed(*current_sample())
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(draw & (MASK64 >> 1))
        random.seed(draw)
        np.random.seed(draw & 0xFFFFFFFF)
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)
