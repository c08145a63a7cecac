"""The supported vLLM lines: each locked test environment is a verified line of every patch, every
declared target exists in the installed vLLM, and an unverified vLLM is told what is verified."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from overlay_testing import REPO, VLLM_VERSION, vllm_is

STATUS = """
import io, contextlib
from govinda_patch.__main__ import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["status"])
report({"rc": rc, "text": out.getvalue()})
"""


def _locked_lines() -> list[str]:
    return sorted(m.group(1) for p in (REPO / "requirements").glob("vllm-*.lock") if (m := re.fullmatch(r"vllm-(.+)\.lock", p.name)))


def _with_vllm_metadata(env: dict, tmp_path, version: str) -> dict:
    """A dist-info ahead of site-packages on the path: the overlay reads this vLLM version
    (versions.py reads package metadata only; status never imports vLLM)."""
    info = tmp_path / "fake_dist" / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"], str(tmp_path / "fake_dist")]))


def test_every_locked_line_is_verified_for_every_patch():
    from packaging.specifiers import SpecifierSet

    lines = _locked_lines()
    assert len(lines) >= 3, lines
    table = yaml.safe_load((REPO / "patches.yaml").read_text())
    for patch in table["patches"]:
        for line in lines:
            assert any(line in SpecifierSet(spec) for spec in patch["vllm_versions"]), (patch["name"], line)
            # Version-specific targets: each line picks at least one target of the patch.
            targets = [t for t in patch["targets"] if "vllm_versions" not in t
                       or any(line in SpecifierSet(s) for s in t["vllm_versions"])]
            assert targets, (patch["name"], line)


def test_the_installed_vllm_is_a_locked_line():
    assert str(VLLM_VERSION) in _locked_lines()


def test_every_active_target_resolves_on_the_installed_vllm(dcu_env, child):
    code = """
    import importlib
    from govinda_patch.manager import Overlay
    from govinda_patch.patching import resolve_owner
    overlay = Overlay.from_environment()
    missing = []
    for entry in overlay.entries.values():
        for target in entry.active_targets:
            try:
                resolve_owner(importlib.import_module(target.module), target.attribute)
            except Exception as exc:
                missing.append(f"{target.label}: {exc}")
    report({"missing": missing, "states": sorted({e.state for e in overlay.entries.values()}),
            "targets": sum(len(e.active_targets) for e in overlay.entries.values())})
    """
    result = child(code, dcu_env)
    assert result.returncode == 0, result
    # Every patch pending, but the one for Hygon's vllm_hcu plugin, which is not installed here.
    assert result.result["states"] == ["pending", "skipped-platform"], result.result
    # One target per patch on the simulated DCU: the ROCm priority target, one alignment target per line.
    assert result.result["missing"] == [] and result.result["targets"] == 5


def test_status_on_an_unverified_vllm_names_the_verified_lines_and_how_to_force(child, base_env, tmp_path):
    env = _with_vllm_metadata(base_env, tmp_path, "0.99.0")
    result = child(STATUS, env)
    assert result.returncode == 0, result
    text = result.result["text"]
    assert "vllm=0.99.0" in text
    table = yaml.safe_load((REPO / "patches.yaml").read_text())
    for patch in table["patches"]:
        (line,) = [l for l in text.splitlines() if l.strip().startswith(patch["name"] + " ")]
        assert "skipped-version" in line and "GOVINDA_FORCE=1" in line, line
        assert all(spec in line for spec in patch["vllm_versions"]), line

    forced = child(STATUS, dict(env, GOVINDA_FORCE="1"))
    assert forced.returncode == 0, forced
    forced_text = forced.result["text"]
    assert "skipped-version" not in forced_text
    assert forced_text.count("applies it anyway") == len(table["patches"]), forced_text


@pytest.mark.skipif(not vllm_is(">=0.33"), reason="vLLM 0.33 lays the KV cache out itself (create_kv_cache_views)")
def test_cache_views_laid_out_by_vllm_hold_our_pages(child, dcu_env):
    code = """
    import torch
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor, create_kv_cache_views
    from govinda_patch.int8.backend import GovindaInt8AttentionBackend, GovindaInt8AttentionImpl, as_page_rows

    stock = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.float16)
    spec = GovindaInt8AttentionBackend.customize_spec(stock)
    page, num_blocks = spec.page_size_bytes, 5
    impl = GovindaInt8AttentionImpl(4, 64, 64 ** -0.5, 2, None, None, "auto")
    torch.manual_seed(0)
    key, value = torch.randn(2, 7, 2, 64, dtype=torch.float16)
    slots = torch.tensor([0, 5, 33, 64, 100, 130, 159])
    expected = torch.zeros(num_blocks, page, dtype=torch.int8)   # the rows vLLM < 0.33 allocates
    impl.do_kv_cache_update(None, key, value, expected, slots)
    layouts = {}
    for layout in get_supported_kv_cache_layouts([GovindaInt8AttentionBackend]):
        # Two layers in one allocation, placed as vLLM's planner does for the layout.
        block_outer = layout.is_block_outermost
        tensor = KVCacheTensor(size=2 * num_blocks * page, layers=["l0", "l1"],
                               layer_stride=page if block_outer else num_blocks * page,
                               block_stride=2 * page if block_outer else page)
        raw = torch.zeros(tensor.size, dtype=torch.int8)
        views = create_kv_cache_views(raw, spec, num_blocks, layout, tensor)
        impl.do_kv_cache_update(None, key, value, views[1], slots)
        pages = raw.view(num_blocks, 2, page).transpose(0, 1) if block_outer else raw.view(2, num_blocks, page)
        layouts[layout.name] = {"view_dims": views[1].dim(), "rows_alias_buffer": as_page_rows(views[1]).data_ptr() == pages[1].data_ptr(),
                                "written_as_rows": bool(torch.equal(pages[1], expected)), "other_layer_untouched": not bool(pages[0].any())}
    report({"stock_page": stock.page_size_bytes, "page": page, "spec_is_idempotent": GovindaInt8AttentionBackend.customize_spec(spec) == spec,
            "layouts": layouts})
    """
    result = child(code, dict(dcu_env, TRITON_INTERPRET="1"), timeout=600)
    assert result.returncode == 0, result
    r = result.result
    assert r["page"] == 32 * 2 * 2 * (64 + 4) and r["stock_page"] == 32 * 2 * 2 * 64 * 2
    assert r["spec_is_idempotent"] is True
    assert len(r["layouts"]) >= 2, r  # layer-outermost and block-outermost layouts
    for name, check in r["layouts"].items():
        assert check == {"view_dims": 4, "rows_alias_buffer": True, "written_as_rows": True, "other_layer_untouched": True}, (name, check)


def test_max_model_len_is_read_from_the_command_line_as_vllm_reads_it(child, dcu_env):
    """launch_shape.max_model_len_arg (which block-table widths the background compiles for)
    against the installed vLLM's own serve parser, on the forms vLLM accepts and refuses."""
    from govinda_patch.int8.launch_shape import max_model_len_arg

    values = ["4096", "1552", "1k", "1K", "25.6k", "2M", "1.5K", "1.5", "auto", "-1", "0", "x"]
    code = f"""
    import contextlib, io
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = ServeSubcommand().subparser_init(FlexibleArgumentParser(prog="vllm").add_subparsers())
    read = {{}}
    for value in {values!r}:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                read[value] = parser.parse_args(["m", "--max-model-len", value]).max_model_len
        except SystemExit:
            read[value] = "refused"
    report(read)
    """
    result = child(code, dcu_env)  # vLLM's argument defaults need a platform: the simulated DCU's
    assert result.returncode == 0, result
    read = result.result
    assert read["1K"] == 1024 and read["1.5K"] == "refused", read  # the parser is really vLLM's
    for value in values:
        expected = read[value] if isinstance(read[value], int) and read[value] > 0 else None
        assert max_model_len_arg(["vllm", "serve", "m", "--max-model-len", value]) == expected, (value, read[value])
        assert max_model_len_arg(["vllm", "serve", "m", f"--max-model-len={value}"]) == expected, (value, read[value])
