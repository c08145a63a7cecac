"""The accuracy study's 4-bit candidates (bench/accuracy/kv_schemes.py, issue #28): plain-torch
fake quantizers, checked on synthetic K with outlier channels (the study runs them on real K/V)."""

import torch

from bench.accuracy import kv_schemes


def _keys():
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(256, 4, 128, generator=generator)
    keys[..., [3, 70]] *= 20  # real K has a few large channels
    return keys


def relative_error(name, x):
    return float((kv_schemes.SCHEMES[name](x) - x).norm() / x.norm())


def test_int4_candidates_bound_their_error_and_the_rotation_pays_on_outliers():
    keys = _keys()
    plain = relative_error("int4_sym", keys)
    rotated = relative_error("int4_sym_rotated", keys)
    assert rotated < plain / 2  # outlier channels spread over the head
    # Symmetric 4-bit after rotation: half a step of absmax/7 per element, so well under 0.15.
    assert rotated < 0.15
    assert relative_error("int4_asym_rotated", keys) < 0.15
    assert relative_error("vllm_int4", keys) < 0.15
    # 8 bits stay ~16x finer than 4.
    assert relative_error("govinda_int8_rotated", keys) < rotated / 8


def test_int4_codes_are_sixteen_levels_per_row():
    x = torch.randn(32, 2, 64, generator=torch.Generator().manual_seed(1))
    for name, levels in (("int4_sym", 15), ("vllm_int4", 16)):
        out = kv_schemes.SCHEMES[name](x)
        assert out.shape == x.shape and out.dtype == x.dtype
        if name == "int4_sym":  # unrotated: each row holds at most 15 distinct values
            assert max(len(torch.unique(row)) for row in out.reshape(-1, 64)) <= levels


def test_vllm_int4_keeps_the_zero_point_in_the_scale_mantissa():
    # A row already on the 16-level grid of its own min and max comes back within the masked
    # scale's rounding (the low 4 mantissa bits cleared: a relative 2^-19 of the scale).
    dim = 64
    signs = kv_schemes._vllm_rht_signs(dim, torch.device("cpu"))
    hadamard = kv_schemes._hadamard(dim, torch.device("cpu")) * dim**0.5
    grid = (torch.arange(dim) % 16).float() * 0.25 - 1.0  # rotated-domain values on a 0.25 grid
    x = ((grid @ hadamard.T) / dim * signs)[None, None, :]
    back = kv_schemes.vllm_int4(x)
    assert float((back - x).abs().max()) < 1e-4


def test_grouped_scales_are_finer_than_one_per_row():
    keys = _keys()
    per_row = relative_error("int4_asym_rotated", keys)
    assert relative_error("int4_g32_asym_rotated", keys) < per_row
    assert relative_error("int4_g16_asym_rotated", keys) < relative_error("int4_g32_asym_rotated", keys)
