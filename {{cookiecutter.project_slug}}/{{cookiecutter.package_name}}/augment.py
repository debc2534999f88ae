"""Training augmentation: a random crop with zero padding and a horizontal flip per image, from (seed, epoch,
index) alone. One implementation serves the loader (a batch of one) and `data.on_device`: the same bits."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .datasets.randomness import sample_seeds, shift_right

CROP_PADDING = 4


def augment_batch(images: torch.Tensor, seed: int, epoch: int, indices: torch.Tensor) -> torch.Tensor:
    """Random crop and flip of each image (count, ..., height, width), its index from `indices`."""
    draw = sample_seeds(seed, epoch, indices.to(images.device))
    span = 2 * CROP_PADDING + 1
    dy = (shift_right(draw, 32) * (2**32 % span) + (draw & 0xFFFFFFFF)) % span  # the unsigned draw % span
    dx, flip = shift_right(draw, 8) % span, shift_right(draw, 16) & 1
    count, height, width = images.shape[0], *images.shape[-2:]
    channels = math.prod(images.shape[1:-2])  # the dims between count and height, as one
    padded = F.pad(images, (CROP_PADDING,) * 4)
    padded = padded.reshape(count, channels, *padded.shape[-2:])
    rows = dy[:, None] + torch.arange(height, device=images.device)
    columns = torch.arange(width, device=images.device)
    columns = torch.where(flip[:, None] == 1, width - 1 - columns, columns) + dx[:, None]
    batch = torch.arange(count, device=images.device)[:, None, None]
    out = padded[batch, :, rows[:, :, None], columns[:, None, :]]  # (count, height, width, channels)
    return out.permute(0, 3, 1, 2).reshape(images.shape).contiguous()


def augment(image: torch.Tensor, seed: int, epoch: int, index: int) -> torch.Tensor:
    """`augment_batch` of one image (..., height, width): its crop and flip from (seed, epoch, index)."""
    return augment_batch(image[None], seed, epoch, torch.tensor([index]))[0]
