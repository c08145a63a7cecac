"""CPU smoke runs of the H200 kernel benchmark and accuracy scripts (``--smoke``).

Each runs as ``python -m bench.<module>`` from the repo root, as documented. Both scripts run
tiny shapes under ``TRITON_INTERPRET=1`` with this interpreter's vLLM. The
tests check that every contender the installed vLLM offers was called with valid arguments,
that a contender this vLLM lacks (``int8_per_token_head`` before 0.26) is skipped with a
recorded reason, and that our kernels produce finite output close to the references.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from overlay_testing import run_module

REPO = Path(__file__).resolve().parent.parent
KERNEL_FILES = [
    REPO / "kernels" / name
    for name in ("int8_kv_store.py", "int8_paged_attention.py", "int8_decode_attention.py", "int8_prefill_attention.py")
]

pytestmark = pytest.mark.skipif(
    not all(path.exists() for path in KERNEL_FILES), reason="Govinda's INT8 kernels are not in kernels/ yet"
)


def _vllm_loaded(payload: dict) -> bool:
    """The scripts record where vLLM's kernels came from (a dict), or the import error."""
    loaded = isinstance(payload["kernels"]["vllm"], dict)
    if importlib.util.find_spec("vllm") is not None:  # locating it imports nothing
        assert loaded, f"vLLM is installed but its Triton backend did not load: {payload['kernels']['vllm']}"
    return loaded


def _run_script(module: str, out: Path, env: dict, *extra: str) -> dict:
    # Forked from the warm interpreter (tests/overlay_testing.run_module): each script imports vLLM.
    completed = run_module(f"bench.{module}", ["--smoke", "--out", str(out), *extra], env, timeout=600, cwd=REPO)
    assert completed.returncode == 0, f"{module} failed\n{completed.stdout[-4000:]}\n{completed.stderr[-4000:]}"
    return json.loads(out.read_text())


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _check_meta(payload: dict) -> None:
    meta = payload["meta"]
    assert meta["smoke"] is True
    for key in ("torch", "triton", "date_utc", "command_line"):
        assert meta.get(key), key
    assert meta["env"].get("TRITON_INTERPRET") == "1"


def _check_int8pth(record: dict, payload: dict) -> None:
    """Upstream int8_per_token_head runs where vLLM has it and is skipped with a reason otherwise."""
    availability = payload["kernels"]["vllm_int8pth"]
    if Version(payload["meta"].get("vllm", "0")) >= Version("0.26.0"):
        assert availability == "available", availability
    if availability == "available":
        assert record["status"] == "ok", record
    else:
        assert record["status"] == "skipped"
        assert record["reason"]


def _child_env(cache_dir: Path) -> dict:
    """This environment minus GOVINDA_* switches, with the repo on PYTHONPATH (as conftest's base_env)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOVINDA_")}
    env.update({"PYTHONPATH": str(REPO), "GOVINDA_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1"})
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


@pytest.fixture(scope="module")
def bench_payload(tmp_path_factory, cache_dir):
    return _run_script("kernel_bench", tmp_path_factory.mktemp("bench") / "bench.json", _child_env(cache_dir))


@pytest.fixture(scope="module")
def accuracy_payload(tmp_path_factory, cache_dir):
    return _run_script("kernel_accuracy", tmp_path_factory.mktemp("accuracy") / "accuracy.json", _child_env(cache_dir))


def test_bench_smoke_structure_and_our_outputs(bench_payload):
    payload = bench_payload
    _check_meta(payload)
    assert payload["kernels"]["ours"] == "ok"
    assert set(payload["sections"]) == {"copy", "stream", "decode", "prefill", "store"}
    # The streaming-read yardstick times a real GPU only.
    assert payload["sections"]["stream"]["status"] == "skipped"
    for name, section in payload["sections"].items():
        assert section["status"] == "ok" or name == "stream", (name, section.get("error"))
    ours = f"ours_bs{payload['config']['ours_block_size']}"
    bf16 = f"vllm_bf16_bs{payload['config']['bf16_block_size']}"
    int8pth = f"vllm_int8pth_bs{payload['config']['int8pth_block_size']}"
    vllm_ok = _vllm_loaded(payload)

    attention_cases = payload["sections"]["decode"]["cases"] + payload["sections"]["prefill"]["cases"]
    assert len(attention_cases) == len(payload["config"]["decode_cases"]) + 2 * len(payload["config"]["prefill_totals"])
    for case in attention_cases:
        contenders = case["contenders"]
        record = contenders[ours]
        assert record["status"] == "ok", (case["case"], record.get("error"))
        assert record["steps"], case["case"]
        for step in record["steps"]:
            assert step["output_finite"] is True, case["case"]
            assert _is_finite_number(step["output_abs_mean"]) and step["output_abs_mean"] > 0
            if vllm_ok:
                # INT8 quantization error of these (outlier-heavy) inputs stays well below
                # the output magnitude; a wrong head, block or position would not.
                diff = step["max_abs_diff_vs_bf16"]
                assert _is_finite_number(diff), case["case"]
                assert diff < 0.5, (case["case"], diff)
        if vllm_ok:
            assert contenders[bf16]["status"] == "ok", (case["case"], contenders[bf16].get("error"))
        _check_int8pth(contenders[int8pth], payload)
        assert set(case["time_ratios"]) == set(payload["sections"][
            "decode" if case["case"].startswith("decode") else "prefill"
        ]["timing_modes"])

    for case in payload["sections"]["store"]["cases"]:
        record = case["contenders"][ours]
        assert record["status"] == "ok", (case["case"], record.get("error"))
        assert record["bit_exact_vs_store_reference"] is True, case["case"]
        assert _is_finite_number(record["roundtrip_max_abs_err_k"])
        assert record["roundtrip_max_abs_err_k"] > 0  # really quantized, not copied
        if vllm_ok:
            assert case["contenders"][bf16]["status"] == "ok"
            assert case["contenders"][bf16]["roundtrip_max_abs_err_k"] == 0.0  # bf16 stores exactly
        _check_int8pth(case["contenders"][int8pth], payload)


def test_fa3_line_smoke_skips_fa3_off_gpu_and_measures_our_error(tmp_path, cache_dir):
    """--fa3 (prefill cases only, to stay cheap): FA3 and our FA3 prefill are skipped with the
    reason on a CPU; our kernels and stock TRITON_ATTN bf16 run and get an error against fp32
    attention on the original K/V."""
    payload = _run_script("kernel_bench", tmp_path / "fa3.json", _child_env(cache_dir), "--fa3", "--sections", "prefill")
    config = payload["config"]
    fa3, ours = f"fa3_bf16_bs{config['bf16_block_size']}", f"ours_bs{config['ours_block_size']}"
    triton_bf16 = f"vllm_bf16_bs{config['bf16_block_size']}"
    cases = payload["sections"]["prefill"]["cases"]
    assert [case["variant"] for case in cases] == ["one_shot", "chunked"]
    for case in cases:
        contenders = case["contenders"]
        assert list(contenders) == [fa3, triton_bf16, ours, f"ours_fa3_bs{config['ours_block_size']}"]
        for name in (fa3, f"ours_fa3_bs{config['ours_block_size']}"):
            assert contenders[name]["status"] == "skipped" and "NVIDIA GPU" in contenders[name]["reason"]
        measured = [ours] + ([triton_bf16] if _vllm_loaded(payload) else [])
        for name in measured:
            assert contenders[name]["status"] == "ok", (name, contenders[name].get("error"))
            for step in contenders[name]["steps"]:
                assert step["output_finite"] is True
                # Error vs fp32 on the originals: nonzero (INT8 K/V of these outlier-heavy
                # inputs, or bf16 roundings), bounded.
                assert 0 < step["max_abs_err_vs_fp32_original"] < 0.5, (name, step)
        assert set(case["time_ratios"]["eager"]) == {"ours_over_fa3", "ours_fa3_over_fa3", "vllm_bf16_over_fa3"}


def test_accuracy_smoke_errors_are_finite_and_small(accuracy_payload):
    payload = accuracy_payload
    _check_meta(payload)
    config = payload["config"]
    ours = f"ours_bs{config['ours_block_size']}"
    int8pth = f"vllm_int8pth_bs{config['int8pth_block_size']}"
    vllm_ok = _vllm_loaded(payload)
    for section_name in ("decode", "prefill_chunk"):
        section = payload["sections"][section_name]
        assert section["status"] == "ok", section.get("error")
        case = section["case"]
        record = case["contenders"][ours]
        assert record["status"] == "ok", record.get("error")
        assert len(record["sequences"]) == len(case["batch"])
        for entry, reference_max in zip(record["sequences"], case["reference_max_abs"]):
            assert entry["output_finite"] is True
            errors = entry["vs_original_kv"]
            assert _is_finite_number(errors["max_abs_err"]) and _is_finite_number(errors["mean_abs_err"])
            # Kernel arithmetic vs float32 on the very K/V the cache holds: half-precision level.
            assert entry["vs_dequantized_cache"]["max_abs_err"] < 2e-2 * max(1.0, reference_max), entry
            # End to end: quantization error dominates, bounded well below the output scale.
            assert errors["rel_l2_err"] < 0.1, entry
        if vllm_ok:
            bf16_record = next(r for n, r in case["contenders"].items() if n.startswith("vllm_bf16"))
            assert bf16_record["status"] == "ok", bf16_record.get("error")
            for entry in bf16_record["sequences"]:
                assert entry["vs_original_kv"]["rel_l2_err"] < 1e-2
        _check_int8pth(case["contenders"][int8pth], payload)


def test_decode_tuning_sweep_smoke(tmp_path, base_env):
    """bench.tune_decode: every variant (whole head and 2 slices, two split policies, a floor of 4
    tiles per split where the table has 1) runs under the interpreter and matches the table
    configuration's output."""
    out = tmp_path / "tune.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.tune_decode", "--smoke", "--block-n", "16",
         "--warps", "4", "--d-slice", "0,32", "--programs-per-sm", "1,2", "--min-tiles", "4",
         "--out", str(out)],
        env=base_env, cwd=str(REPO), capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload["table_key"] == "interpreter"
    assert [case["batch"] for case in payload["cases"]] == [1, 3]
    for case in payload["cases"]:
        assert len(case["variants"]) == 4
        assert {record["variant"]["min_tiles"] for record in case["variants"]} == {4}
        splits = set()
        for record in case["variants"]:
            assert record["status"] == "ok" and record["output_finite"], record
            # fp16 outputs of different tilings/split counts: a few units of the last place at most
            assert record["max_abs_diff_vs_table"] < 5e-3, record
            splits.add(record["num_splits"])
        assert len(splits) == 2  # the two split policies gave different grids
