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


# K/V split schemes (#28's next step: K at 8 bits, V at 4).


def _kv(seed):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(2, 3, 17, 64, generator=generator)  # [batch, kv heads, tokens, head_dim]
    keys[..., [5, 40]] *= 15
    values = torch.randn(2, 3, 17, 64, generator=generator)
    return keys, values


def _through_cache(name, layers=2):
    cache = kv_schemes.FakeQuantKVCache(kv_schemes.SCHEMES[name])
    inputs, outputs = [], []
    for layer in range(layers):
        keys, values = _kv(layer)
        inputs.append((keys, values))
        outputs.append(cache.update(keys, values, layer))
    return cache, inputs, outputs


def test_kv_pairs_apply_each_sides_own_scheme():
    expected = {
        "k8_rot_v4_asym_rot": ("govinda_int8_rotated", "int4_asym_rotated"),
        "k8_rot_v4_g32_asym_rot": ("govinda_int8_rotated", "int4_g32_asym_rotated"),
        "k4_asym_rot_v8_rot": ("int4_asym_rotated", "govinda_int8_rotated"),
    }
    assert set(kv_schemes.PAIR_SCHEMES) == set(expected)
    for name, (key_name, value_name) in expected.items():
        pair = kv_schemes.SCHEMES[name]
        assert (pair.key_scheme, pair.value_scheme) == (key_name, value_name)
        # The very functions of the single-format schemes, not copies.
        assert pair.key is kv_schemes.SCHEMES[key_name] and pair.value is kv_schemes.SCHEMES[value_name]
        cache, inputs, outputs = _through_cache(name)
        for layer, ((keys, values), (read_keys, read_values)) in enumerate(zip(inputs, outputs)):
            want_keys = kv_schemes.SCHEMES[key_name](keys)
            want_values = kv_schemes.SCHEMES[value_name](values)
            assert torch.equal(read_keys, want_keys) and torch.equal(read_values, want_values)
            # What the cache keeps is what attention read.
            assert torch.equal(cache.layers[layer].keys, want_keys)
            assert torch.equal(cache.layers[layer].values, want_values)
            # And the other side's map would have given something else: the sides are not swapped.
            assert not torch.equal(read_keys, kv_schemes.SCHEMES[value_name](keys))
            assert not torch.equal(read_values, kv_schemes.SCHEMES[key_name](values))


def test_kv_pair_cache_counts_rows_like_the_single_map_cache():
    for name in ("k8_rot_v4_asym_rot", "govinda_int8_rotated"):
        cache, _, _ = _through_cache(name, layers=3)
        assert cache.update_calls == 3
        assert cache.quantized_rows == 3 * 2 * 3 * 17  # layers x batch x heads x tokens
    # A single map still serves both sides.
    cache, inputs, outputs = _through_cache("int4_asym_rotated", layers=1)
    (keys, values), (read_keys, read_values) = inputs[0], outputs[0]
    assert torch.equal(read_keys, kv_schemes.SCHEMES["int4_asym_rotated"](keys))
    assert torch.equal(read_values, kv_schemes.SCHEMES["int4_asym_rotated"](values))


def test_quantizer_error_measures_each_side_with_its_own_map():
    from bench.accuracy import teacher_forced

    baseline, _, _ = _through_cache("bf16", layers=2)  # any stored K/V will do
    pair = teacher_forced.quantizer_error(baseline, kv_schemes.SCHEMES["k8_rot_v4_asym_rot"])
    eight = teacher_forced.quantizer_error(baseline, kv_schemes.SCHEMES["govinda_int8_rotated"])
    four = teacher_forced.quantizer_error(baseline, kv_schemes.SCHEMES["int4_asym_rotated"])
    assert pair["k_rel_l2_error"] == eight["k_rel_l2_error"]
    assert pair["v_rel_l2_error"] == four["v_rel_l2_error"]
    assert pair["v_rel_l2_error"] > 8 * pair["k_rel_l2_error"]  # 4 bits on V, 8 on K


def test_bytes_per_token_head_and_capacity():
    # Every scheme the study can run has a size.
    for name in kv_schemes.SCHEMES:
        assert all(b > 0 for b in kv_schemes.kv_bytes(name, 64))
        assert name in kv_schemes.SCHEME_DESCRIPTIONS
    assert kv_schemes.kv_bytes("bf16", 64) == (128, 128)
    assert kv_schemes.kv_bytes("govinda_int8_rotated", 256) == (260, 260)  # 256 codes + fp32 scale
    assert kv_schemes.kv_bytes("int4_asym_rotated", 256) == (136, 136)  # 128 bytes of nibbles + scale + zero
    assert kv_schemes.kv_bytes("k8_rot_v4_asym_rot", 64) == (68, 40)
    assert kv_schemes.kv_bytes("k8_rot_v4_asym_rot", 256) == (260, 136)
    assert kv_schemes.kv_bytes("k8_rot_v4_g32_asym_rot", 256) == (260, 128 + 8 * 8)
    assert kv_schemes.kv_bytes("k4_asym_rot_v8_rot", 256) == (136, 260)
    assert kv_schemes.capacity_vs_bf16("bf16", 256) == 1.0
    assert kv_schemes.capacity_vs_bf16("k8_rot_v4_asym_rot", 256) == 1024 / 396
    assert kv_schemes.capacity_vs_bf16("k4_asym_rot_v8_rot", 64) == kv_schemes.capacity_vs_bf16("k8_rot_v4_asym_rot", 64)
    # Halving V alone cannot reach #28's 3.5x: even a free V would leave K's 8 bits at < 4x.
    assert kv_schemes.capacity_vs_bf16("k8_rot_v4_asym_rot", 256) < 3.5


def test_report_carries_the_bytes_table():
    from bench.accuracy import smollm2

    table = smollm2.storage("k8_rot_v4_asym_rot")
    assert table["64"] == {"k_bytes": 68, "v_bytes": 40, "capacity_vs_bf16": 256 / 108}
    assert table["256"]["k_bytes"] + table["256"]["v_bytes"] == 396
    args = smollm2.parse_args(["--schemes", ",".join(kv_schemes.PAIR_SCHEMES), "--skip-needle"])
    assert args.schemes == list(kv_schemes.PAIR_SCHEMES)
