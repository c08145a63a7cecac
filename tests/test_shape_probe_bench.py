"""``python -m bench.shape_probe``: the side-by-side bookkeeping, with the probe runs stubbed (the
real runs import vLLM twice per pair; reports/cpu/shape_probe_qwen35_vllm026.json is one)."""

from __future__ import annotations

import json

from bench import shape_probe


def test_pairs_alternate_and_the_median_ratio_is_reported(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_run_once(side, argv):
        seen.append((side, argv))
        return {"side": side, "seconds": {"in_process": 20.0, "subprocess": 40.0}[side], "returncode": 0,
                "shape": {"block_size": 1552}, "modelinfo_files": 1, "stderr_tail": []}

    monkeypatch.setattr(shape_probe, "run_once", fake_run_once)
    out = tmp_path / "r.json"
    assert shape_probe.main(["m", "--pairs", "2", "--out", str(out), "--", "--language-model-only"]) == 0
    assert [side for side, _ in seen] == ["in_process", "subprocess", "subprocess", "in_process"]
    assert seen[0][1] == ["vllm", "serve", "m", "--max-model-len", "32768", "--load-format", "dummy", "--language-model-only"]
    result = json.loads(out.read_text())
    assert result["in_process_over_subprocess"] == 0.5 and result["same_shape_everywhere"] is True
    assert "ratio 0.500" in capsys.readouterr().out


def test_differing_shapes_fail_the_run(monkeypatch):
    answers = iter([{"block_size": 1552}, {"block_size": 784}])
    monkeypatch.setattr(shape_probe, "run_once", lambda side, argv: {"side": side, "seconds": 1.0, "shape": next(answers)})
    assert shape_probe.main(["m", "--pairs", "1"]) == 1


def test_both_sides_are_valid_python():
    for code in shape_probe.SIDES.values():
        compile(code, "<side>", "exec")
    assert "kv_capacity_probe.model_inspection_here = contextlib.nullcontext" in shape_probe.SIDES["subprocess"]
