"""The kernel bench fails a run whose contenders produced NaN or inf outputs (bench.kernel_bench):
a broken kernel's fast time must not read as a result."""

from __future__ import annotations

from bench import kernel_bench


def _sections(finite_ours_rot):
    contenders = {
        "ours_bs16": {"output_finite": True},
        "ours_rot_bs16": {"output_finite": finite_ours_rot},
        "vllm_bf16_bs16": {"status": "skipped"},  # no output recorded: not counted
    }
    return {
        "decode": {"cases": [{"case": "decode_b1_ctx4096", "contenders": contenders}]},
        "store": {"status": "error", "error": "boom"},  # a failed section has no cases
    }


def test_non_finite_outputs_names_each_case_and_contender():
    assert kernel_bench.non_finite_outputs(_sections(False)) == ["decode_b1_ctx4096 ours_rot_bs16"]
    assert kernel_bench.non_finite_outputs(_sections(True)) == []


def test_main_exits_non_zero_and_names_them(monkeypatch, tmp_path, capsys):
    for finite, expected_rc in ((False, 1), (True, 0)):
        payload = {"meta": {"non_finite_outputs": kernel_bench.non_finite_outputs(_sections(finite))}}
        monkeypatch.setattr(kernel_bench, "prepare_environment", lambda smoke: None)
        monkeypatch.setattr(kernel_bench, "run", lambda options, sections, payload=payload: payload)
        assert kernel_bench.main(["--sections", "decode", "--out", str(tmp_path / "out.json")]) == expected_rc
        err = capsys.readouterr().err
        assert ("NON-FINITE OUTPUTS (1): decode_b1_ctx4096 ours_rot_bs16" in err) == (not finite)
