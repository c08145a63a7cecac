"""The kernel bench's same-bytes streaming floor (bench.kernel_bench.add_stream_floor): what it
records and how its ratios follow from the measured times (the device timing itself is faked)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import kernel_bench, stream_read
from govinda_patch.kernel_package import import_kernel


def _ctx(smoke=False, stream_bw=4000.0):
    layout = import_kernel("int8_kv_layout")
    geometry = SimpleNamespace(num_kv_heads=4, head_dim=256)
    return SimpleNamespace(
        smoke=smoke, stream_bw_gbps=stream_bw, ours=SimpleNamespace(layout=layout), timer=object(), device="cuda",
        config=SimpleNamespace(geometry=geometry, ours_block_size=1552, rep_ms=10.0),
    )


def _case(ours_us, fa3_us):
    contenders = {"ours_bs1552": {"graph_time_us_total": ours_us}, "fa3_bf16_bs800": {"graph_time_us_total": fa3_us}}
    return {"case": "decode_b1_ctx1000", "contenders": contenders,
            "time_ratios": {"graph": {"ours_over_fa3": ours_us / fa3_us, "ours_fa3_over_fa3": None}}}


def test_floor_is_the_same_bytes_read_at_the_measured_stream_rate(monkeypatch):
    seen = {}

    def fake_measure(timer, device, nbytes, rep_ms):
        seen["nbytes"] = nbytes
        return {"stream_read_GBps": 2000.0}

    monkeypatch.setattr(stream_read, "measure", fake_measure)
    case = _case(ours_us=30.0, fa3_us=60.0)
    kernel_bench.add_stream_floor(_ctx(), case, kv_tokens=1000)
    expected_bytes = 1000 * 2 * 4 * (256 + 4)  # K + V int8 rows and their fp32 scales
    assert seen["nbytes"] == expected_bytes
    floor_us = expected_bytes / 2000.0 / 1e3
    assert case["stream_floor"]["time_us"] == pytest.approx(floor_us)
    ratios = case["time_ratios"]["graph"]
    assert ratios["stream_floor_over_fa3"] == pytest.approx(floor_us / 60.0)
    assert ratios["ours_over_stream_floor"] == pytest.approx(30.0 / floor_us)


def test_no_floor_without_the_stream_section_or_in_a_smoke_run(monkeypatch):
    monkeypatch.setattr(stream_read, "measure", lambda *a, **k: pytest.fail("must not time anything"))
    for ctx in (_ctx(smoke=True), _ctx(stream_bw=None)):
        case = _case(30.0, 60.0)
        kernel_bench.add_stream_floor(ctx, case, kv_tokens=1000)
        assert "stream_floor" not in case and set(case["time_ratios"]["graph"]) == {"ours_over_fa3", "ours_fa3_over_fa3"}


def test_a_failed_floor_is_recorded_and_changes_no_ratio(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no device")

    monkeypatch.setattr(stream_read, "measure", broken)
    case = _case(30.0, 60.0)
    kernel_bench.add_stream_floor(_ctx(), case, kv_tokens=1000)
    assert case["stream_floor"]["status"] == "error" and "no device" in case["stream_floor"]["error"]
    assert set(case["time_ratios"]["graph"]) == {"ours_over_fa3", "ours_fa3_over_fa3"}
