"""GOVINDA_PREFILL_KERNEL and its resolution (govinda_patch/int8/prefill_kernel.py) off a GPU."""

import logging
from dataclasses import replace

import torch

from govinda_patch.int8 import prefill_kernel
from govinda_patch.kernel_package import import_kernel
from govinda_patch.settings import PREFILL_KERNELS, Settings

lc = import_kernel("launch_configs")
CPU = torch.device("cpu")


def test_switch_parses_and_bad_values_warn():
    assert PREFILL_KERNELS == ("auto", "triton", "fa3")
    assert Settings.from_env({}).prefill_kernel == "auto"
    assert Settings.from_env({"GOVINDA_PREFILL_KERNEL": " FA3 "}).prefill_kernel == "fa3"
    settings = Settings.from_env({"GOVINDA_PREFILL_KERNEL": "flash"})
    assert settings.prefill_kernel == "auto"
    assert any("GOVINDA_PREFILL_KERNEL" in w and "'auto'" in w for w in settings.warnings)


def test_only_hopper_asks_for_fa3():
    assert lc.ARCH_TABLES["cuda_sm90"].prefill_kernel == "fa3"
    assert {key for key, table in lc.ARCH_TABLES.items() if table.prefill_kernel != "triton"} == {"cuda_sm90"}


def test_auto_takes_the_table_and_falls_back_to_triton_without_fa3(caplog):
    table = lc.ARCH_TABLES["interpreter"]
    choice = prefill_kernel.resolve(table, 128, CPU, environ={})
    assert (choice.name, choice.varlen_attention) == ("triton", None)
    assert "table interpreter" in choice.description
    with caplog.at_level(logging.WARNING, logger="govinda"):
        choice = prefill_kernel.resolve(replace(table, prefill_kernel="fa3"), 128, CPU, environ={})
    assert choice.name == "triton" and "NVIDIA GPU" in choice.description
    assert not caplog.records  # auto: a quiet fallback, said in the builder's info line


def test_explicit_switch_wins_and_an_unavailable_fa3_warns_once(caplog):
    sm90 = lc.ARCH_TABLES["cuda_sm90"]
    choice = prefill_kernel.resolve(sm90, 256, CPU, environ={"GOVINDA_PREFILL_KERNEL": "triton"})
    assert choice.name == "triton" and "GOVINDA_PREFILL_KERNEL=triton" in choice.description
    with caplog.at_level(logging.WARNING, logger="govinda"):
        choice = prefill_kernel.resolve(lc.ARCH_TABLES["interpreter"], 64, CPU, environ={"GOVINDA_PREFILL_KERNEL": "fa3"})
    assert choice.name == "triton"
    assert [r.getMessage() for r in caplog.records] == [
        "GOVINDA_PREFILL_KERNEL=fa3 but FA3 needs an NVIDIA GPU; prefill runs on the Triton kernel"
    ]
