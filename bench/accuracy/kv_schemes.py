"""KV-cache number formats compared by the accuracy study, as quantize-then-dequantize maps.

Each scheme maps a K or V tensor ``[..., head_dim]`` to what attention would read back from a
cache in that format. :class:`FakeQuantKVCache` applies a scheme inside a transformers
``DynamicCache``: Llama calls ``cache.update`` with K *after* RoPE, and attention uses what
``update`` returns for every token, the current ones included -- the same data flow as vLLM,
whose prefill also reads the chunk's own K/V back from the (INT8) cache.

``govinda_int8`` is exactly Govinda's quantizer (``kernels/int8_kv_layout.py``, which the Triton
store kernel matches bit for bit); the others are reference points.

A scheme is either one map for both K and V, or a :class:`KVPair` of two maps (K through one
format, V through another: issue #28's K at 8 bits with V at 4). ``ROW_BYTES`` gives each
format's bytes per (token, head) row, so :func:`kv_bytes` and :func:`capacity_vs_bf16` state what
a scheme would cost in a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple, Union

import torch
from transformers import DynamicCache

from govinda_patch.kernel_package import import_kernel

_layout = import_kernel("int8_kv_layout")
_rotation = import_kernel("kv_rotation")

FakeQuantize = Callable[[torch.Tensor], torch.Tensor]

# vLLM 0.26 ``_reshape_cache_per_token_head`` (v1/attention/ops/triton_reshape_and_cache_flash.py).
VLLM_INT8_SCALE_FLOOR = 1e-6
VLLM_INT8_QMAX = 127.0
VLLM_INT8_QMIN = -128.0
FP8_E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
ASYM_LEVELS = 255  # 256 codes of one byte


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


def bf16_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """vLLM's default (unquantized) KV dtype for a bf16 model: the noise floor of "no quantization"."""
    return x.to(torch.bfloat16).to(x.dtype)


def govinda_int8(x: torch.Tensor) -> torch.Tensor:
    """Govinda: symmetric absmax/127, IEEE division, round-half-to-even, scale floor 1e-8."""
    q, scale = _layout.quantize_reference(x)
    return _layout.dequantize_reference(q, scale).to(x.dtype)


def vllm_int8(x: torch.Tensor) -> torch.Tensor:
    """Upstream vLLM 0.26 ``int8_per_token_head``.

    scale = max(absmax / 127, 1e-6); q = x * (1 / scale); +-0.5 (half away from zero), clamp to
    [-128, 127], then the float->int8 store truncates toward zero; attention multiplies by scale.
    """
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / VLLM_INT8_QMAX).clamp_min(VLLM_INT8_SCALE_FLOOR)
    scaled = xf * (1.0 / scale)
    shifted = torch.where(scaled >= 0, scaled + 0.5, scaled - 0.5)
    q = shifted.clamp(VLLM_INT8_QMIN, VLLM_INT8_QMAX).trunc()
    return (q * scale).to(x.dtype)


def int8_asymmetric(x: torch.Tensor) -> torch.Tensor:
    """Asymmetric per (token, head): fp32 scale = (max - min) / 255 and fp32 zero point = min.

    Codes 0..255 (stored as int8 minus 128), round-half-to-even; 4 more bytes per (token, head)
    than the symmetric format.
    """
    xf = x.float()
    low = xf.amin(dim=-1, keepdim=True)
    high = xf.amax(dim=-1, keepdim=True)
    scale = ((high - low) / ASYM_LEVELS).clamp_min(_layout.SCALE_FLOOR)
    codes = torch.round((xf - low) / scale).clamp_(0, ASYM_LEVELS)
    return (codes * scale + low).to(x.dtype)


def _hadamard(dim: int, device: torch.device) -> torch.Tensor:
    """Orthonormal Sylvester-Hadamard matrix (dim a power of two: 64, 128, 256)."""
    if dim & (dim - 1):
        raise ValueError(f"Hadamard rotation needs a power-of-two head_dim, got {dim}")
    matrix = torch.ones(1, 1, device=device)
    while matrix.shape[0] < dim:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return matrix / dim**0.5


def govinda_int8_hadamard(x: torch.Tensor) -> torch.Tensor:
    """Govinda's quantizer applied to each head row after an orthonormal Hadamard rotation.

    A candidate improvement, not what ships: rotating K and Q by the same orthonormal matrix
    leaves q.k unchanged, and rotating V back after P@V leaves the output unchanged, so only the
    quantization error differs -- the rotation spreads K's outlier channels over all 64 elements
    (upstream vLLM rotates for its int4_per_token_head format).
    """
    rotation = _hadamard(x.shape[-1], x.device)
    return (govinda_int8(x.float() @ rotation) @ rotation.T).to(x.dtype)


def govinda_int8_rotated(x: torch.Tensor) -> torch.Tensor:
    """Govinda INT8 with ``GOVINDA_KV_ROTATION=hadamard``: the kernels' fp32 butterfly rotation
    (``kernels/kv_rotation.py``) before quantizing, rotated back after dequantizing -- what
    attention computes with the rotated query and the rotated-back output."""
    rotated = _rotation.hadamard_reference(x)
    return _rotation.hadamard_reference(govinda_int8(rotated)).to(x.dtype)


def _fixed_signs(dim: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(dim)
    return (torch.randint(0, 2, (dim,), generator=generator) * 2 - 1).float().to(device)


def govinda_int8_signed_hadamard(x: torch.Tensor) -> torch.Tensor:
    """Candidate: a fixed random sign per channel before the Hadamard rotation (``H diag(s)``)."""
    signs = _fixed_signs(x.shape[-1], x.device)
    restored = _rotation.hadamard_reference(govinda_int8(_rotation.hadamard_reference(x.float() * signs)))
    return (restored * signs).to(x.dtype)


def fp8_e4m3_unit_scale(x: torch.Tensor) -> torch.Tensor:
    """vLLM ``fp8`` / ``fp8_e4m3`` KV cache with the default per-tensor scale 1.0 (saturating cast)."""
    xf = x.float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return xf.to(torch.float8_e4m3fn).float().to(x.dtype)


# 4-bit candidates for issue #28 (no INT4 kernel exists yet; these fix the format first).
INT4_SYM_MAX = 7.0  # symmetric codes -7..7 (the 16th code unused, as INT8 leaves -128)
INT4_LEVELS = 15  # asymmetric codes 0..15
VLLM_INT4_SCALE_FLOOR = 1e-6


def int4_symmetric(x: torch.Tensor) -> torch.Tensor:
    """Symmetric 4-bit per (token, head): fp32 scale absmax / 7, codes -7..7, round-half-even."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / INT4_SYM_MAX).clamp_min(_layout.SCALE_FLOOR)
    return (torch.round(xf / scale).clamp_(-INT4_SYM_MAX, INT4_SYM_MAX) * scale).to(x.dtype)


def int4_asymmetric(x: torch.Tensor) -> torch.Tensor:
    """Asymmetric 4-bit per (token, head): fp32 scale (max - min) / 15 and fp32 zero point (min)."""
    xf = x.float()
    low = xf.amin(dim=-1, keepdim=True)
    scale = ((xf.amax(dim=-1, keepdim=True) - low) / INT4_LEVELS).clamp_min(_layout.SCALE_FLOOR)
    return (torch.round((xf - low) / scale).clamp_(0, INT4_LEVELS) * scale + low).to(x.dtype)


def _grouped(quantize: FakeQuantize, group: int) -> FakeQuantize:
    """``quantize`` with its own scale (and zero point) per ``group`` consecutive elements of a row."""

    def fake(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return quantize(x.reshape(*shape[:-1], shape[-1] // group, group)).reshape(shape)

    fake.__name__ = f"{quantize.__name__}_g{group}"
    return fake


def _rotated(quantize: FakeQuantize) -> FakeQuantize:
    """``quantize`` between the kernels' fp32 Hadamard rotation and its inverse (itself)."""

    def fake(x: torch.Tensor) -> torch.Tensor:
        return _rotation.hadamard_reference(quantize(_rotation.hadamard_reference(x.float()))).to(x.dtype)

    fake.__doc__ = f"{quantize.__name__} after the Hadamard rotation (GOVINDA_KV_ROTATION=hadamard's)."
    return fake


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, x + 0.5, x - 0.5).trunc()


def _vllm_rht_signs(dim: int, device: torch.device) -> torch.Tensor:
    """The fixed signs of upstream's randomized Hadamard transform (its seed, its generator)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(0x9E3779B9)
    return (2.0 * torch.bernoulli(torch.full((dim,), 0.5), generator=generator) - 1.0).to(device)


def vllm_int4(x: torch.Tensor) -> torch.Tensor:
    """Upstream vLLM 0.26 ``int4_per_token_head`` (v1/attention/ops/int4_per_token_head.py), re-derived:

    K/V are rotated by the unnormalised Hadamard transform of ``x * signs`` and rounded to the
    model dtype; then per (token, head) scale = max((max - min) / 15, 1e-6), zero point =
    clamp(round_half_away(-min / scale), 0, 15), codes = clamp(round_half_away(x / scale + zp),
    0, 15). The zero point is kept in the scale's low 4 mantissa bits, so reads use the scale with
    those bits cleared. Attention is then equivalent to reading ``H^T((q - zp) * scale) / dim``
    with the signs undone.
    """
    dim = x.shape[-1]
    signs = _vllm_rht_signs(dim, x.device)
    hadamard = _hadamard(dim, x.device) * dim**0.5  # unnormalised +-1
    rotated = ((x.float() * signs) @ hadamard).to(x.dtype).float()
    low = rotated.amin(dim=-1, keepdim=True)
    high = rotated.amax(dim=-1, keepdim=True)
    scale = ((high - low) / INT4_LEVELS).clamp_min(VLLM_INT4_SCALE_FLOOR)
    zero = _round_half_away(-low / scale).clamp(0, INT4_LEVELS)
    codes = _round_half_away(rotated * (1.0 / scale) + zero).clamp(0, INT4_LEVELS)
    read_scale = (scale.view(torch.int32) & -16).view(torch.float32)
    restored = (codes - zero) * read_scale
    return ((restored @ hadamard.T) / dim * signs).to(x.dtype)


@dataclass(frozen=True)
class KVPair:
    """K and V through different formats (``key`` for K, ``value`` for V).

    Built from entries of ``SCHEMES`` by name, so each side runs exactly that scheme's
    quantizer; the names are kept for the bytes table and the report.
    """

    key_scheme: str
    value_scheme: str
    key: FakeQuantize
    value: FakeQuantize


Scheme = Union[FakeQuantize, KVPair]


def kv_maps(scheme: Scheme) -> Tuple[FakeQuantize, FakeQuantize]:
    """(map for K, map for V): a single map serves both sides."""
    if isinstance(scheme, KVPair):
        return scheme.key, scheme.value
    return scheme, scheme


SCHEMES: Dict[str, Scheme] = {
    "bf16": bf16_roundtrip,
    "govinda_int8": govinda_int8,
    "vllm_int8": vllm_int8,
    "int8_asym": int8_asymmetric,
    "int8_hadamard": govinda_int8_hadamard,
    "govinda_int8_rotated": govinda_int8_rotated,
    "int8_signed_hadamard": govinda_int8_signed_hadamard,
    "fp8_e4m3": fp8_e4m3_unit_scale,
    "int4_sym": int4_symmetric,
    "int4_sym_rotated": _rotated(int4_symmetric),
    "int4_asym_rotated": _rotated(int4_asymmetric),
    "vllm_int4": vllm_int4,
    "int4_g32_asym_rotated": _rotated(_grouped(int4_asymmetric, 32)),
    "int4_g16_asym_rotated": _rotated(_grouped(int4_asymmetric, 16)),
}


def _pair(key_scheme: str, value_scheme: str) -> KVPair:
    return KVPair(key_scheme, value_scheme, SCHEMES[key_scheme], SCHEMES[value_scheme])


# Issue #28's next step: score errors come from K, so K keeps 8 bits and only V drops to 4.
# k4_asym_rot_v8_rot is the mirror control: it shows which side the 4-bit cost comes from.
PAIR_SCHEMES: Dict[str, KVPair] = {
    "k8_rot_v4_asym_rot": _pair("govinda_int8_rotated", "int4_asym_rotated"),
    "k8_rot_v4_g32_asym_rot": _pair("govinda_int8_rotated", "int4_g32_asym_rotated"),
    "k4_asym_rot_v8_rot": _pair("int4_asym_rotated", "govinda_int8_rotated"),
}
SCHEMES.update(PAIR_SCHEMES)

SCHEME_DESCRIPTIONS: Dict[str, str] = {
    "fp32": "unquantized fp32 K/V (baseline)",
    "bf16": "bf16 K/V (vLLM default cache dtype; noise floor)",
    "govinda_int8": "Govinda INT8: symmetric absmax/127, round-half-even, fp32 scale per (token, head)",
    "vllm_int8": "vLLM 0.26 int8_per_token_head: symmetric, x*(1/scale), round-half-away, clamp [-128,127]",
    "int8_asym": "INT8 asymmetric: fp32 scale + fp32 zero point (min) per (token, head)",
    "int8_hadamard": "Govinda INT8 after a per-head Hadamard rotation as an fp32 matrix product (first study of the idea)",
    "govinda_int8_rotated": "Govinda INT8 with GOVINDA_KV_ROTATION=hadamard (the kernels' fp32 butterfly rotation)",
    "int8_signed_hadamard": "candidate: fixed random channel signs, then the Hadamard rotation, then Govinda INT8",
    "fp8_e4m3": "vLLM fp8_e4m3, per-tensor scale 1.0",
    "int4_sym": "INT4 candidate (#28), unrotated: symmetric absmax/7, codes -7..7, fp32 scale per (token, head)",
    "int4_sym_rotated": "INT4 candidate (#28): the kernels' Hadamard rotation, then symmetric absmax/7",
    "int4_asym_rotated": "INT4 candidate (#28): the kernels' Hadamard rotation, then fp32 scale + fp32 zero point (min), codes 0..15",
    "vllm_int4": "vLLM 0.26 int4_per_token_head: sign-flipped Hadamard, asymmetric 0..15, zero point in the scale's low mantissa bits",
    "int4_g32_asym_rotated": "INT4 candidate (#28): the Hadamard rotation, then scale + zero point per 32 elements of a head row",
    "int4_g16_asym_rotated": "INT4 candidate (#28): the Hadamard rotation, then scale + zero point per 16 elements of a head row",
    "k8_rot_v4_asym_rot": "K/V split (#28): K as govinda_int8_rotated, V as int4_asym_rotated",
    "k8_rot_v4_g32_asym_rot": "K/V split (#28): K as govinda_int8_rotated, V as int4_g32_asym_rotated",
    "k4_asym_rot_v8_rot": "K/V split (#28), control: K as int4_asym_rotated, V as govinda_int8_rotated",
}

FP32_SCALE = 4  # bytes of one fp32 scale or zero point

# Bytes of one (token, head) row of K or of V in each format, for head_dim ``d``: the data plus
# the stored scale (and zero point) in fp32, as the reference quantizers compute them. fp8's
# per-tensor scale and page padding are left out: they do not grow with tokens.
ROW_BYTES: Dict[str, Callable[[int], int]] = {
    "fp32": lambda d: 4 * d,
    "bf16": lambda d: 2 * d,
    "govinda_int8": lambda d: d + FP32_SCALE,
    "vllm_int8": lambda d: d + FP32_SCALE,
    "int8_asym": lambda d: d + 2 * FP32_SCALE,
    "int8_hadamard": lambda d: d + FP32_SCALE,
    "govinda_int8_rotated": lambda d: d + FP32_SCALE,
    "int8_signed_hadamard": lambda d: d + FP32_SCALE,
    "fp8_e4m3": lambda d: d,
    "int4_sym": lambda d: d // 2 + FP32_SCALE,
    "int4_sym_rotated": lambda d: d // 2 + FP32_SCALE,
    "int4_asym_rotated": lambda d: d // 2 + 2 * FP32_SCALE,
    "vllm_int4": lambda d: d // 2 + FP32_SCALE,  # the zero point rides in the scale's mantissa
    "int4_g32_asym_rotated": lambda d: d // 2 + (d // 32) * 2 * FP32_SCALE,
    "int4_g16_asym_rotated": lambda d: d // 2 + (d // 16) * 2 * FP32_SCALE,
}


def kv_bytes(name: str, head_dim: int) -> Tuple[int, int]:
    """(K bytes, V bytes) per (token, head) for scheme ``name`` ("fp32" included)."""
    scheme = SCHEMES.get(name)
    if isinstance(scheme, KVPair):
        return ROW_BYTES[scheme.key_scheme](head_dim), ROW_BYTES[scheme.value_scheme](head_dim)
    row = ROW_BYTES[name](head_dim)
    return row, row


def capacity_vs_bf16(name: str, head_dim: int) -> float:
    """How many times bf16's tokens the same KV bytes hold in scheme ``name`` (page padding aside)."""
    return sum(kv_bytes("bf16", head_dim)) / sum(kv_bytes(name, head_dim))


class FakeQuantKVCache(DynamicCache):
    """A ``DynamicCache`` that stores (and hands to attention) K and V read back through a scheme.

    ``fake_quantize`` is one map for both, or a :class:`KVPair` (its ``key`` map for K, its
    ``value`` map for V).
    """

    def __init__(self, fake_quantize: Scheme, config=None):
        super().__init__(config=config)
        self.fake_quantize = fake_quantize
        self.quantize_key, self.quantize_value = kv_maps(fake_quantize)
        # Counted so callers can prove the hook ran for every layer and token.
        self.quantized_rows = 0
        self.update_calls = 0

    def update(self, key_states, value_states, layer_idx: int, cache_kwargs: Optional[dict] = None):
        self.update_calls += 1
        self.quantized_rows += key_states.numel() // key_states.shape[-1]
        return super().update(
            self.quantize_key(key_states), self.quantize_value(value_states), layer_idx, cache_kwargs
        )
