"""Tensors whose memory is never written (Note [Untouched memory]): what a
rank holds for the parameters other ranks own, and what materialize() leaves
for them."""

from __future__ import annotations

import mmap

import torch

__all__ = ["untouched_like"]

# Note [Untouched memory]: a tensor's CPU memory that nobody writes costs
# address space, not memory: the kernel maps a page only when it is first
# touched. torch.empty gets memory from malloc, which may hand back pages
# freed a moment ago (already resident), so tensors of at least _MMAP_MIN
# bytes get an anonymous mapping of their own instead; it is unmapped when
# the tensor's storage dies. Smaller ones come from torch.empty: their pages
# are few and shared with other small allocations anyway.
_MMAP_MIN = 64 * 1024


def _storage_bytes(size: torch.Size, stride: tuple[int, ...], itemsize: int) -> int:
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(size, stride))) * itemsize


def untouched_like(t: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """A tensor of ``t``'s shape, strides and dtype on ``device`` (default:
    ``t``'s, or cpu for a meta tensor) whose memory has never been written
    (Note [Untouched memory]). Its values are unspecified (zeros, on CPU)."""
    device = torch.device(device if device is not None else
                          ("cpu" if t.device.type == "meta" else t.device))
    size, stride = t.size(), t.stride()
    nbytes = _storage_bytes(size, stride, t.element_size())
    if device.type != "cpu" or nbytes < _MMAP_MIN:
        return torch.empty_strided(size, stride, dtype=t.dtype, device=device)
    buf = mmap.mmap(-1, nbytes)  # the tensor keeps the mapping alive
    flat = torch.frombuffer(buf, dtype=t.dtype)
    return flat.as_strided(size, stride)
