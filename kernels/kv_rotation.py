"""Orthonormal Walsh-Hadamard rotation of K/V (and of the query and output) along head_dim.

Quantizing ``H x`` instead of ``x`` spreads a row's outlier channels over every element, so the
per-row absmax scale fits the row better; ``H`` is orthonormal and symmetric (``H H = I``), so
``(H q) . (H k) = q . k`` and ``H sum_n p_n (H v_n) = sum_n p_n v_n``: with K and V stored
rotated, attention rotates the query on the way in and the output on the way out, and nothing
else changes (same bytes, same page layout).

``H`` is the Sylvester-ordered Hadamard matrix scaled by ``1 / sqrt(D)``. Both the Triton helper
and the torch reference compute it with the same fp32 butterfly ("constant geometry": every
stage maps ``x[i], x[i + D/2]`` to ``y[2i] = x[i] + x[i + D/2]``, ``y[2i + 1] = x[i] - x[i + D/2]``,
``log2(D)`` stages, then one multiply by the fp32 constant ``1 / sqrt(D)``). Additions and one
multiply in a fixed order are IEEE-exact operations, so kernel and reference agree bit for bit;
the rotation costs ``D log2(D)`` additions per row and needs no matrix in memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NONE = "none"
HADAMARD = "hadamard"
ROTATIONS = (NONE, HADAMARD)


def check_rotation(rotation: str) -> bool:
    """True for the Hadamard rotation, False for none; anything else is a clear error."""
    if rotation not in ROTATIONS:
        raise ValueError(f"unknown KV rotation {rotation!r}; use one of {ROTATIONS}")
    return rotation == HADAMARD


def log2_exact(head_dim: int) -> int:
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    return head_dim.bit_length() - 1


def normalizer(head_dim: int) -> float:
    """``1 / sqrt(head_dim)`` as the fp32 value both implementations multiply by."""
    return float(torch.tensor(head_dim**-0.5, dtype=torch.float32))


@triton.jit
def hadamard_rows(x, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    """Rotate every row of fp32 ``x [ROWS, HEAD_DIM]`` by the orthonormal Hadamard matrix."""
    for _ in tl.static_range(LOG2_HEAD_DIM):
        halves = tl.permute(tl.reshape(x, (ROWS, 2, HEAD_DIM // 2)), (0, 2, 1))
        low, high = tl.split(halves)
        x = tl.reshape(tl.join(low + high, low - high), (ROWS, HEAD_DIM))
    return x * NORM


def hadamard_reference(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x [..., D]`` rotated along its last dimension, exactly as :func:`hadamard_rows` does."""
    head_dim = x.shape[-1]
    stages = log2_exact(head_dim)
    y = x.float()
    for _ in range(stages):
        low, high = y[..., : head_dim // 2], y[..., head_dim // 2 :]
        y = torch.stack((low + high, low - high), dim=-1).reshape(y.shape)
    return y * normalizer(head_dim)


def hadamard_matrix(head_dim: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The same rotation as a ``[D, D]`` matrix (symmetric: ``x @ H`` rotates rows of ``x``)."""
    return hadamard_reference(torch.eye(head_dim, dtype=torch.float32)).to(device=device, dtype=dtype)
