"""The AMD compile gate (``python -m govinda_patch amd-aot``) on this CPU-only machine.

The gate needs compiled-mode Triton (the kernel tests switch the interpreter on for the whole
session), so everything that compiles runs in a child process without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from govinda_patch.amd_resources import parse_listing
from overlay_testing import REPO, run_child

KINDS = {"store", "decode_split", "decode_write", "decode_reduce", "prefill", "gather"}


@pytest.fixture
def compiled_env(base_env):
    env = dict(base_env)
    env.pop("TRITON_INTERPRET", None)
    env.pop("GOVINDA_KERNEL_ARCH", None)
    return env


def test_ci_subset_compiles_every_kernel_for_both_targets_and_refuses_gfx906(tmp_path, compiled_env):
    done = subprocess.run(
        [sys.executable, "-m", "govinda_patch", "amd-aot", "--subset", "ci", "--output", str(tmp_path)],
        cwd=REPO, env=compiled_env, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "aot_resources.json").read_text())
    assert report["passed"] and not report["failures"]
    rows = report["rows"]
    for arch in ("gfx90a", "gfx942"):
        ours = [r for r in rows if r["arch"] == arch]
        # "rotate" / "rotate_decode": the rotated prefill's pre/post pass and the rotated
        # decode's query pass, in the rotated case (D=256: gfx90a only).
        rotated = {"rotate", "rotate_decode"} if arch == "gfx90a" else set()
        assert {r["kernel"] for r in ours} == KINDS | rotated
        for row in ours:
            assert row["status"] == "ok" and row["scratch_bytes"] == 0, row
            assert 0 < row["lds_bytes"] <= 65536 or row["kernel"] in ("store", "gather")  # no tl.dot
            assert 1 <= row["waves_per_simd"] <= 8
            # Where LDS does not limit, our register model must agree with the compiler's own.
            if row["waves_by_lds"] > row["waves_per_simd"] or row["lds_bytes"] == 0:
                assert row["waves_per_simd"] == row["compiler_occupancy"], row
    # Upstream Triton 3.6 (vLLM 0.18/0.26 lines) refuses gfx906; 3.8 (the 0.33 line) compiles it,
    # with spills in the larger tiles (probed, not gated: gfx906 has no AGPRs to park them in).
    probes = [r for r in rows if r["arch"] == "gfx906"]
    statuses = {r["status"] for r in probes}
    assert probes and (statuses == {"unsupported"} or statuses <= {"ok", "problem"}), statuses
    if statuses == {"unsupported"}:
        assert "unsupported target" in probes[0]["diagnostic"]
    markdown = (tmp_path / "aot_resources.md").read_text()
    assert "rocm_gfx9 table entries" in markdown and f"gfx906: {', '.join(sorted(statuses))}" in markdown


def test_gate_fails_a_config_that_spills_and_captures_the_wrappers_options(child, compiled_env):
    # 128x64 prefill tiles with 8 warps cap a wave at 256 VGPRs: scratch on gfx90a at D=128.
    result = child(
        """
        from dataclasses import replace
        from govinda_patch import amd_aot
        from govinda_patch.kernel_package import import_kernel
        lc = import_kernel("launch_configs")
        table = lc.ARCH_TABLES["rocm_gfx9"]
        spilling = lc.KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=1)
        variant = amd_aot.Variant("candidate", ("prefill",), replace(table, prefill={128: spilling}), "spill")
        case = amd_aot.Case(128, "bf16", 6)
        [(kind, launch)] = amd_aot.capture_variant(variant, case)
        row = amd_aot.run_job(amd_aot.Job("gfx90a", case, variant, kind, spilling.label, launch))
        table_launches = amd_aot.capture_variant(amd_aot.variants(128, with_candidates=False)[0], case)
        report({
            "kind": kind, "options": launch.options(), "row": row,
            "failures": len(amd_aot.gate_failures([row])),
            "table_kinds": sorted({k for k, _ in table_launches}),
            "prefill_constexprs": {k: str(v) for k, v in launch.kwargs.items() if k in ("BLOCK_M", "BLOCK_N", "HEAD_DIM", "GROUP")},
        })
        """,
        compiled_env,
        timeout=600,
    )
    assert result.returncode == 0, result
    data = result.result
    assert data["kind"] == "prefill" and data["options"] == {"num_warps": 8, "num_stages": 1}
    assert data["prefill_constexprs"] == {"GROUP": "6", "HEAD_DIM": "128", "BLOCK_M": "128", "BLOCK_N": "64"}
    assert data["row"]["status"] == "problem" and data["row"]["scratch_bytes"] > 0
    assert data["failures"] == 1
    assert set(data["table_kinds"]) == KINDS


LISTING = """
; Kernel info:
; TotalNumSgprs: 100
; NumVgprs: 256
; NumAgprs: 201
; TotalNumVgprs: 457
; ScratchSize: 0
; Occupancy: 1
  .vgpr_spill_count: 0
  .sgpr_spill_count: 8
"""


def test_occupancy_model():
    heavy = parse_listing(LISTING, lds_bytes=32768, num_warps=4)
    assert (heavy.total_vgprs, heavy.sgpr_spills, heavy.waves_by_vgpr, heavy.waves_per_simd) == (457, 8, 1, 1)
    assert heavy.limited_by == "vgpr" and heavy.problems() == []
    # 256 unified VGPRs -> 2 waves; 64 KiB of LDS for an 8-wave workgroup -> also 2.
    light = parse_listing(LISTING.replace("TotalNumVgprs: 457", "TotalNumVgprs: 256"), lds_bytes=65536, num_warps=8)
    assert (light.waves_by_vgpr, light.waves_by_lds, light.waves_per_simd, light.limited_by) == (2, 2, 2, "vgpr+lds")
    # Granule of 8: 129 registers take 136 -> 3 waves; 4 warps with 64 KiB of LDS -> 1 wave.
    odd = parse_listing(LISTING.replace("TotalNumVgprs: 457", "TotalNumVgprs: 129"), lds_bytes=65536, num_warps=4)
    assert (odd.waves_by_vgpr, odd.waves_by_lds) == (3, 1)
    over = parse_listing(LISTING.replace("ScratchSize: 0", "ScratchSize: 64"), lds_bytes=65537, num_warps=4)
    assert len(over.problems()) == 3  # scratch, LDS over 64 KiB, no room for a workgroup
    with pytest.raises(ValueError):
        parse_listing("; nothing here", lds_bytes=0, num_warps=4)


def test_committed_report_passes_and_covers_the_table():
    path = REPO / "reports" / "amd" / "aot_resources.json"
    report = json.loads(path.read_text())
    assert report["subset"] == "full" and report["passed"]
    from govinda_patch.kernel_package import import_kernel

    lc = import_kernel("launch_configs")
    table = lc.ARCH_TABLES["rocm_gfx9"]
    for head_dim in (64, 128, 256):
        candidates = lc.tuning_candidates("rocm_gfx9", head_dim)
        for kind, configs in (("prefill", candidates.prefill), ("decode_split", candidates.decode)):
            for config in configs:
                rows = [r for r in report["rows"] if r["kernel"] == kind and r["head_dim"] == head_dim and r["config"] == config.label]
                assert {r["arch"] for r in rows} >= {"gfx90a", "gfx942"}, (kind, head_dim, config.label)
                assert all(r["status"] == "ok" for r in rows if r["arch"] != "gfx906")
        for arch in ("gfx90a", "gfx942"):
            rows = [r for r in report["rows"] if r["arch"] == arch and r["head_dim"] == head_dim and r["source"] == "table"]
            labels = {r["kernel"]: r["config"] for r in rows}
            # The committed report is of the table as it is now.
            assert labels["prefill"] == table.prefill_config(head_dim).label
            assert labels["decode_split"] == table.decode_config(head_dim).label
            assert all(r["status"] == "ok" for r in rows)


def test_mixed_batches_of_any_decode_count_reuse_one_compiled_kernel_each(child, compiled_env):
    # A step's decode count changes from step to step; any kernel argument that followed it into
    # a constexpr or a pointer's alignment would be compiled again while a request waits (vLLM's
    # JIT monitor). Bind every launch the way JITFunction.run keys its cache and count the keys.
    result = child(
        """
        import torch
        from govinda_patch import amd_aot
        from govinda_patch.kernel_package import import_kernel
        from govinda_patch.launch_capture import capture_launches
        layout = import_kernel("int8_kv_layout")
        attention = import_kernel("int8_paged_attention")
        configs = import_kernel("launch_configs").ARCH_TABLES["rocm_gfx9"]
        kv_heads, group, head_dim, block_size = 2, 4, 128, 16
        cache = torch.zeros(layout.cache_shape(64, block_size, kv_heads, head_dim), dtype=torch.int8)
        keys, splits = {}, set()
        for num_decodes in range(1, 10):
            lens = [30 + d for d in range(num_decodes)] + [40]
            query_lens = [1] * num_decodes + [7]
            starts = [0]
            for n in query_lens:
                starts.append(starts[-1] + n)
            query = torch.zeros(starts[-1], kv_heads * group, head_dim, dtype=torch.bfloat16)
            plan = attention.GatheredPrefill(
                varlen_attention=lambda *args: None, cu_seqlens_k=torch.tensor([0, 40], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, 7], dtype=torch.int32), total_k=40, max_seqlen_k=40,
                max_seqlen_q=7, num_prefill_tokens=7,
            )
            with capture_launches() as recorder:
                attention.paged_attention_int8(
                    query, cache, torch.zeros_like(query), torch.tensor(starts, dtype=torch.int32),
                    torch.tensor(lens, dtype=torch.int32), torch.zeros(16, 8, dtype=torch.int32),
                    block_size=block_size, num_kv_heads=kv_heads, softmax_scale=0.1, max_query_len=7,
                    max_seq_len=40, num_decodes=num_decodes, configs=configs, gathered_prefill=plan,
                )
            for launch in recorder.launches:
                if launch.name == "decode_split_kernel":
                    splits.add(launch.grid[2])
                _, (options, signature, constexprs, attrs) = amd_aot.bind_launch(launch, "gfx90a")
                key = repr((sorted(options.__dict__.items()), signature, sorted(constexprs.items()), sorted(attrs.items())))
                # The split kernel's single-split form and the reduce's whole-row form are other
                # specializations by design, each a function of the decode count alone (so each is
                # compiled while CUDA graphs are captured): one key per form.
                form = {"decode_split_kernel": "WRITE_OUTPUT", "decode_reduce_kernel": "BLOCK_D"}.get(launch.name)
                keys.setdefault(launch.name + ("" if form is None else f" {form}={launch.kwargs[form]}"), set()).add(key)
        report({"keys": {name: len(found) for name, found in keys.items()}, "splits": sorted(splits)})
        """,
        compiled_env,
        timeout=600,
    )
    assert result.returncode == 0, result
    data = result.result
    assert len([s for s in data["splits"] if s > 1]) >= 2, data  # the split count did change
    assert "_gather_kv_kernel" in data["keys"] and any(name.startswith("decode_reduce_kernel") for name in data["keys"]), data
    assert all(count == 1 for count in data["keys"].values()), data
