"""The decode kernel's L2 prefetch (``KernelConfig.l2_prefetch``, issue #24) on this CPU-only machine.

The NVIDIA form is compiled for sm90 from the real wrapper's launches (PTX and ptxas's resource
report need no GPU); AMD and the interpreter must never get it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest


def test_sm90_decode_prefetches_only_when_asked_without_spills(child, base_env):
    env = dict(base_env)
    env.pop("TRITON_INTERPRET", None)  # compiled mode: the wrapper passes L2_PREFETCH
    result = child(
        """
        import re, subprocess, tempfile, os
        from dataclasses import replace
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import get_ptxas
        from govinda_patch import amd_aot
        from govinda_patch.kernel_package import import_kernel
        lc = import_kernel("launch_configs")
        table = lc.ARCH_TABLES["cuda_sm90"]
        target = GPUTarget("cuda", 90, 32)
        ptxas = get_ptxas(90).path
        rows = []
        for head_dim, group in ((256, 6), (128, 4)):
            for depth in (0, 2):
                for rotation in ("none", "hadamard"):
                    entry = replace(table.decode_config(head_dim), l2_prefetch=depth)
                    configs = replace(table, decode={**dict(table.decode), head_dim: entry})
                    variant = amd_aot.Variant("candidate", ("decode",), configs, entry.label)
                    launches = amd_aot.capture_variant(variant, amd_aot.Case(head_dim, "bf16", group, rotation))
                    split = [launch for kind, launch in launches if kind == "decode_split"][0]
                    kernel = amd_aot.compile_launch(split, "sm90", target)
                    ptx = kernel.asm["ptx"]
                    with tempfile.TemporaryDirectory() as tmp:
                        path = os.path.join(tmp, "k.ptx")
                        open(path, "w").write(ptx)
                        done = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull],
                                              capture_output=True, text=True)
                    info = done.stdout + done.stderr
                    registers = int(re.search(r"Used (\\d+) registers", info).group(1))
                    spills = [int(x) for x in re.findall(r"(\\d+) bytes spill (?:stores|loads)", info)]
                    rows.append({"head_dim": head_dim, "depth": depth, "rotation": rotation,
                                 "passed": split.kwargs.get("L2_PREFETCH", 0), "label": entry.label,
                                 "prefetches": ptx.count("prefetch.global.L2"), "registers": registers,
                                 "spills": spills, "cap": entry.max_registers, "ptxas_rc": done.returncode})
        report(rows)
        """,
        env,
        timeout=900,
    )
    assert result.returncode == 0, result
    rows = result.result
    assert len(rows) == 8
    for row in rows:
        assert row["ptxas_rc"] == 0, row
        assert row["passed"] == row["depth"], row
        assert ("pf" in row["label"]) == (row["depth"] > 0), row
        # A prefetch costs no spill and stays under the table's register cap.
        assert row["spills"] and not any(row["spills"]), row
        if row["cap"]:
            assert row["registers"] <= row["cap"], row
        if row["depth"]:
            # K and V lines of a token row, and the scales: at least four per tile.
            assert row["prefetches"] >= 4, row
        else:
            assert row["prefetches"] == 0, row


def test_prefetch_is_never_passed_on_amd_or_under_the_interpreter(monkeypatch):
    from govinda_patch.kernel_package import import_kernel

    lc = import_kernel("launch_configs")
    attention = import_kernel("int8_paged_attention")
    # No AMD or interpreter table entry or tuning candidate asks for it (AMD has no such instruction).
    for key, table in lc.ARCH_TABLES.items():
        if key.startswith("cuda"):
            continue
        for head_dim in (64, 128, 256):
            assert table.decode_config(head_dim).l2_prefetch == 0, key
            assert all(c.l2_prefetch == 0 for c in lc.tuning_candidates(key, head_dim).decode), key
    config = lc.KernelConfig(block_n=64, d_slice=128, l2_prefetch=2)
    assert "pf2" in config.label and "l2_prefetch" not in str(config.launch_kwargs())
    monkeypatch.setattr(attention, "interpreting", lambda: False)
    import torch

    monkeypatch.setattr(torch.version, "hip", None)
    assert attention._l2_prefetch(config) == {"L2_PREFETCH": 2}
    assert attention._l2_prefetch(replace(config, l2_prefetch=0)) == {}
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert attention._l2_prefetch(config) == {}
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(attention, "interpreting", lambda: True)
    assert attention._l2_prefetch(config) == {}
