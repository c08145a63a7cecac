"""CPU tests of the greedy-agreement workload (bench/greedy_agreement.py, bench/ab.py with
``workload: greedy``) against tests/fake_openai_server.py, and of the H200 sides file."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

from bench import ab, greedy_agreement  # noqa: E402
from fake_openai_server import (  # noqa: E402
    CLEAR_MARGIN,
    FLIPPED_TRUE_TOKEN_LOGPROB,
    NEAR_TIE_MARGIN,
    TRUE_TOKEN_LOGPROB,
    greedy_continuation,
)
from test_serve_bench import (  # noqa: E402,F401 (fake_server_factory is a fixture)
    FAKE_SERVER,
    PYTHON,
    _launcher,
    _run_script,
    _sides_file,
    fake_server_factory,
    free_port,
)

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the moon.\n",
    "def fibonacci(n):\n",
    "Dear hiring manager,",
    "SELECT name FROM users WHERE",
    "Once upon a time",
]


def fake_text(ids):
    return "".join(f" w{i}" for i in ids)


# ----------------------------------------------------------------------------- client


def test_client_records_greedy_continuations(fake_server_factory):
    server = fake_server_factory()
    config = greedy_agreement.GreedyConfig(
        base_url=server.base_url, prompts=PROMPTS[:3], max_tokens=8, repeats=2, label="x", progress=False
    )
    result = greedy_agreement.run(config)

    assert result["schema"] == greedy_agreement.SCHEMA and result["model_id"] == "fake-model"
    assert result["prompt_set"] == "custom" and result["label"] == "x"
    assert [r["prompt"] for r in result["completions"]] == PROMPTS[:3]
    for index, record in enumerate(result["completions"]):
        ids, _, _ = greedy_continuation(PROMPTS[index], 8, None, None)
        assert record["index"] == index and record["error"] == ""
        assert record["token_ids"] == ids
        assert record["text"] == fake_text(ids)
        assert record["finish_reason"] == "length"
        # Top two candidates per token, best first, the chosen token first.
        assert len(record["top_logprobs"]) == 8
        for step, chosen in zip(record["top_logprobs"], ids):
            assert len(step) == 2 and step[0][0] == chosen
            assert step[0][1] - step[1][1] == pytest.approx(CLEAR_MARGIN)
        assert record["text_offsets"][3] == len(fake_text(ids[:3]))
    # The second pass is the same set again; a deterministic server agrees with itself.
    assert len(result["repeat_completions"]) == 1
    assert [r["token_ids"] for r in result["repeat_completions"][0]] == [r["token_ids"] for r in result["completions"]]
    assert result["self_agreement"][0]["identical"] == 3 and result["self_agreement"][0]["prompts"] == 3

    seen = server.requests()
    assert len(seen) == 6
    for request in seen:
        assert request["temperature"] == 0.0 and request["max_tokens"] == 8
        assert request["return_token_ids"] is True and request["return_tokens_as_token_ids"] is True
        assert request["logprobs"] == 2
        assert not request["stream"] and not request["ignore_eos"]


def test_client_default_prompts_and_id_fallbacks(fake_server_factory):
    # A server that ignores return_token_ids: the ids come from the "token_id:N" logprob tokens.
    server = fake_server_factory("--no-token-ids")
    result = greedy_agreement.run(greedy_agreement.GreedyConfig(base_url=server.base_url, max_tokens=4, progress=False))
    assert result["prompt_set"] == "builtin"
    assert [r["prompt"] for r in result["completions"]] == list(greedy_agreement.DEFAULT_PROMPTS)
    assert len(greedy_agreement.DEFAULT_PROMPTS) == 24 and len(set(greedy_agreement.DEFAULT_PROMPTS)) == 24
    first = result["completions"][0]
    assert first["token_ids"] == greedy_continuation(greedy_agreement.DEFAULT_PROMPTS[0], 4, None, None)[0]

    # Neither ids nor logprobs: texts only, so a comparison counts characters.
    no_ids = greedy_agreement.run(greedy_agreement.GreedyConfig(
        base_url=server.base_url, prompts=PROMPTS[:2], max_tokens=4, top_logprobs=0, progress=False))
    assert all(r["token_ids"] is None and r["top_logprobs"] is None for r in no_ids["completions"])
    assert "logprobs" not in server.requests()[-1] or server.requests()[-1]["logprobs"] is None
    comparison = greedy_agreement.compare(no_ids, no_ids)
    assert comparison["prefix_unit"] == "chars" and comparison["identical"] == 2
    assert comparison["mean_common_prefix"] == pytest.approx(sum(len(r["text"]) for r in no_ids["completions"]) / 2)


def test_cli_collects_and_reports_failed_requests(fake_server_factory, tmp_path):
    server = fake_server_factory("--fail-every", "2")
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("first prompt\nsecond\\nprompt\n\nthird prompt\n")
    out = tmp_path / "out.json"
    code = greedy_agreement.main(["--url", server.base_url, "--out", str(out), "--max-tokens", "3",
                                  "--prompts-file", str(prompts_file), "--quiet"])
    assert code == 1  # one request failed
    result = json.loads(out.read_text())
    assert [r["prompt"] for r in result["completions"]] == ["first prompt", "second\nprompt", "third prompt"]
    failed = result["completions"][1]
    assert "HTTP 500" in failed["error"] and failed["token_ids"] is None
    assert result["completions"][0]["error"] == "" and len(result["completions"][2]["token_ids"]) == 3


# ----------------------------------------------------------------------------- comparison


def record(index, ids, finish="length", error="", candidates=None, prompt=None):
    text = fake_text(ids)
    return {
        "index": index, "prompt": prompt or f"p{index}", "text": text, "token_ids": ids,
        "finish_reason": finish, "error": error, "top_logprobs": candidates,
        "text_offsets": [len(fake_text(ids[:k])) for k in range(len(ids))],
    }


def test_compare_counts_agreement_and_divergence_positions():
    baseline = [
        record(0, [11, 12, 13, 14]),
        record(1, [11, 12, 13, 14], candidates=[[[11, -0.1], [5, -3.0]], [[12, -0.2], [5, -2.0]],
                                                  [[13, -0.5], [99, -0.6]], [[14, -0.1], [5, -3.0]]]),
        record(2, [15, 16, 17], finish="stop"),
        record(3, [21]),
        record(4, [31, 32]),
    ]
    other = [
        record(0, [11, 12, 13, 14]),
        record(1, [11, 12, 99, 98], candidates=[[[11, -0.1], [5, -3.0]], [[12, -0.2], [5, -2.0]],
                                                 [[99, -0.4], [13, -1.4]], [[98, -0.1], [5, -3.0]]]),
        record(2, [15, 16, 17, 18, 19]),
        record(3, [22]),
        record(4, [], error="HTTP 500"),
    ]
    c = greedy_agreement.compare_completions(baseline, other)
    assert c["prompts"] == 5 and c["compared"] == 4
    assert c["identical"] == 1 and c["fraction"] == pytest.approx(1 / 5)
    assert c["failed"] == 1 and c["failed_indices"] == [4]
    assert c["prefix_unit"] == "tokens"
    assert c["mean_common_prefix"] == pytest.approx((4 + 2 + 3 + 0) / 4)
    assert c["mean_baseline_length"] == pytest.approx((4 + 4 + 3 + 1) / 4)
    by_index = {d["index"]: d for d in c["divergences"]}
    assert sorted(by_index) == [1, 2, 3]
    assert [by_index[i]["position"] for i in (1, 2, 3)] == [2, 3, 0]
    assert [by_index[i]["kind"] for i in (1, 2, 3)] == ["differs", "ended", "differs"]
    d1 = by_index[1]
    assert d1["baseline_token"] == 13 and d1["side_token"] == 99
    assert d1["baseline_margin"] == pytest.approx(0.1) and d1["side_margin"] == pytest.approx(1.0)
    # Split at the first differing token (" w13" vs " w99"), not inside a shared character run.
    assert d1["baseline_continuation"] == " w11 w12‖ w13 w14"
    assert d1["side_continuation"] == " w11 w12‖ w99 w98"
    d2 = by_index[2]
    assert (d2["baseline_length"], d2["side_length"]) == (3, 5)
    assert d2["baseline_finish_reason"] == "stop" and d2["side_token"] == 18 and d2["baseline_token"] is None
    assert d2["baseline_continuation"] == " w15 w16 w17‖"
    assert by_index[3]["baseline_margin"] is None  # no candidates recorded

    # Long continuations are cut around the split point.
    long_a, long_b = record(0, list(range(100, 160))), record(0, list(range(100, 130)) + [1] * 30)
    (d,) = greedy_agreement.compare_completions([long_a], [long_b])["divergences"]
    split = d["baseline_continuation"].index("‖")
    assert d["baseline_continuation"].startswith("…") and d["baseline_continuation"].endswith("…")
    assert split == 1 + greedy_agreement.CONTEXT_CHARS
    assert len(d["baseline_continuation"]) == 1 + greedy_agreement.CONTEXT_CHARS + 1 + greedy_agreement.DIVERGED_CHARS + 1

    # A side without ids is compared by characters; different prompt sets are not compared.
    no_ids = dict(record(0, [11, 12]), token_ids=None, text=" w11 w1X")
    chars = greedy_agreement.compare_completions([record(0, [11, 12])], [no_ids])
    assert chars["prefix_unit"] == "chars" and chars["divergences"][0]["position"] == len(" w11 w1")
    assert "error" in greedy_agreement.compare_completions([record(0, [1])], [record(0, [1], prompt="other")])


def test_compare_cli_writes_json_and_markdown(tmp_path, capsys):
    def result(label, records):
        return {"schema": greedy_agreement.SCHEMA, "label": label, "config": {"max_tokens": 4},
                "completions": records, "self_agreement": [{"prompts": 2, "identical": 2}]}

    base = result("off", [record(0, [1, 2, 3, 4]), record(1, [5, 6, 7, 8])])
    side = result(None, [record(0, [1, 2, 3, 4]), record(1, [5, 6, 9, 9])])
    (tmp_path / "off.json").write_text(json.dumps(base))
    (tmp_path / "on.json").write_text(json.dumps(side))
    code = greedy_agreement.main(["compare", str(tmp_path / "off.json"), str(tmp_path / "on.json"),
                                  "--json", str(tmp_path / "cmp.json"), "--md", str(tmp_path / "cmp.md")])
    assert code == 0
    comparison = json.loads((tmp_path / "cmp.json").read_text())
    assert comparison["schema"] == greedy_agreement.COMPARISON_SCHEMA
    assert (comparison["baseline"], comparison["side"]) == ("off", "on")  # unlabelled: the file name
    assert comparison["identical"] == 1 and comparison["divergences"][0]["position"] == 2
    md = (tmp_path / "cmp.md").read_text()
    assert md == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "# Greedy agreement: on vs off (baseline)" in md and "1/2 identical (50.0%)" in md
    assert "self-agreement over repeats: off: 2/2; on: 2/2" in md
    assert "| 1 | p1 | 2 | n/a | n/a |  w5 w6‖ w7 w8 |  w5 w6‖ w9 w9 |" in md


# ----------------------------------------------------------------------------- teacher-forced scoring


def test_parse_prompt_logprobs_in_vllm_shape():
    # As vLLM's completions endpoint returns it: None for the first prompt token, then the top-k
    # (here 2) plus the true token when it ranks lower (rank 7 at the second position).
    choice = {
        "prompt_token_ids": [5, 9, 3],
        "prompt_logprobs": [
            None,
            {"9": {"logprob": -0.2, "rank": 1, "decoded_token": "a"}, "4": {"logprob": -2.0, "rank": 2}},
            {"6": {"logprob": -1.5, "rank": 2}, "3": {"logprob": -4.0, "rank": 7}, "8": {"logprob": -0.3, "rank": 1}},
        ],
    }
    parsed = greedy_agreement.parse_prompt_logprobs(choice)
    assert parsed == {"token_ids": [5, 9, 3], "true_logprobs": [-0.2, -4.0], "top1_ids": [9, 8],
                      "top1_logprobs": [-0.2, -0.3], "top2_logprobs": [-2.0, -1.5]}
    with pytest.raises(RuntimeError, match="no prompt_token_ids"):
        greedy_agreement.parse_prompt_logprobs({"prompt_logprobs": choice["prompt_logprobs"]})
    without_true = dict(choice, prompt_logprobs=[None, choice["prompt_logprobs"][1], {"8": {"logprob": -0.3, "rank": 1},
                                                                                     "6": {"logprob": -1.5, "rank": 2}}])
    with pytest.raises(RuntimeError, match="without the true token"):
        greedy_agreement.parse_prompt_logprobs(without_true)


def test_teacher_forced_texts_alternate_sources_and_are_stable():
    texts = greedy_agreement.teacher_forced_texts(5, 500)
    assert [t["source"] for t in texts] == ["prose", "code", "prose", "code", "prose"]
    assert all(len(t["text"]) == 500 for t in texts)
    assert len({t["sha256"] for t in texts}) == 5
    assert texts == greedy_agreement.teacher_forced_texts(5, 500)
    sources = {s.name: s.text for s in greedy_agreement._text_corpus().sources().values()}
    for t in texts:
        assert sources[t["source"]][t["start"]:t["start"] + 500] == t["text"]
    # Evenly spaced: each source's slices start at its beginning and end at its end.
    assert texts[0]["start"] == 0 and texts[4]["start"] == len(sources["prose"]) - 500
    assert texts[3]["start"] == len(sources["code"]) - 500


def test_compare_teacher_forced_refuses_different_texts_and_tokenizations():
    def scored(index, sha, ids, top1, error=""):
        n = len(ids) - 1
        return {"index": index, "sha256": sha, "error": error, "token_ids": ids, "true_logprobs": [-1.0] * n,
                "top1_ids": top1, "top1_logprobs": [-0.1] * n, "top2_logprobs": [-3.0] * n}

    base = [scored(0, "a", [1, 2, 3], [2, 3]), scored(1, "b", [4, 5], [5])]
    assert "different texts" in greedy_agreement.compare_teacher_forced(base, [scored(0, "x", [1, 2, 3], [2, 3])] + base[1:])["error"]
    other = [scored(0, "a", [1, 2, 3], [2, 9]), scored(1, "b", [4, 6], [6])]  # text 1 tokenized differently
    c = greedy_agreement.compare_teacher_forced(base, other)
    assert c["mismatched_indices"] == [1] and c["positions"] == 2 and c["flips"] == 1
    assert c["top1_agreement"] == pytest.approx(0.5) and c["perplexity_ratio_minus_1"] == pytest.approx(0.0)
    failed = greedy_agreement.compare_teacher_forced(base, [scored(0, "a", [], [], error="HTTP 500"), other[1]])
    assert failed["error"] == "no comparable positions" and failed["failed_indices"] == [0]

    # A side that could not load the texts: the comparison says why instead of "not measured".
    side = {"completions": [], "teacher_forced": [], "teacher_forced_error": "ImportError: no pydoc_data"}
    c = greedy_agreement.compare({"completions": [], "teacher_forced": base}, side)
    assert c["teacher_forced"] == {"error": "ImportError: no pydoc_data"}
    assert "not comparable: ImportError: no pydoc_data" in greedy_agreement.teacher_forced_line(c["teacher_forced"])


# ----------------------------------------------------------------------------- ab.py


def test_ab_greedy_workload_two_sides_and_report(tmp_path):
    launcher = _launcher(tmp_path, "serve.sh", f'exec "{PYTHON}" "{FAKE_SERVER}" "$@"\n')
    sides = _sides_file(tmp_path, {
        "name": "greedy",
        "model": "fake-model",
        "server_command": launcher,
        "health_timeout_s": 30,
        "stop_grace_s": 5,
        "bench": {"workload": "greedy", "prompts": PROMPTS, "max_tokens": 8, "repeats": 2,
                  "teacher_forced_texts": 3, "teacher_forced_chars": 400},
        "sides": [
            {"name": "off", "env": {"GOVINDA_DISABLE": "1"}},
            # The "overlay" side: the moon prompt flips at token 3 (a near tie), France stops after 2,
            # and in teacher-forced scoring another token leads at every 5th position.
            {"name": "on", "env": {"GOVINDA_DISABLE": "0"},
             "server_args": ["--greedy-diverge", "moon=3", "--greedy-stop", "France=2", "--flip-prompt-every", "5"],
             "log_patterns": {"overlay": {"regex": "govinda:", "min": 1}}},
        ],
    })
    code = ab.main(["--sides", sides, "--port", str(free_port()), "--work-dir", str(tmp_path / "work"),
                    "--report-dir", str(tmp_path / "reports")])
    assert code == 0
    result = json.loads((tmp_path / "reports" / "greedy.json").read_text())
    off, on = result["sides"]
    assert off["status"] == "ok" and on["status"] == "ok" and not off["problems"] and not on["problems"]
    assert off["env_check"]["ok"] and on["env_check"]["ok"]
    assert on["log_counts"]["overlay"]["count"] == 1
    for side in (off, on):
        assert side["bench"]["label"] == side["name"]
        assert [r["prompt"] for r in side["bench"]["completions"]] == PROMPTS
        assert side["bench"]["self_agreement"][0]["identical"] == len(PROMPTS)
    assert off["bench"]["completions"][0]["token_ids"] == greedy_continuation(PROMPTS[0], 8, None, None)[0]
    assert on["bench"]["completions"][0]["finish_reason"] == "stop"
    assert "sla" not in result

    (row,) = result["agreement"]
    assert (row["side"], row["baseline"], row["valid"]) == ("on", "off", True)
    assert row["identical"] == 4 and row["prompts"] == 6 and row["fraction"] == pytest.approx(4 / 6)
    assert row["mean_common_prefix"] == pytest.approx((8 * 4 + 2 + 3) / 6)
    divergences = {d["index"]: d for d in row["divergences"]}
    assert sorted(divergences) == [0, 1]
    assert (divergences[0]["position"], divergences[0]["kind"], divergences[0]["side_finish_reason"]) == (2, "ended", "stop")
    assert (divergences[1]["position"], divergences[1]["kind"]) == (3, "differs")
    assert divergences[1]["side_margin"] == pytest.approx(NEAR_TIE_MARGIN)
    assert divergences[1]["baseline_margin"] == pytest.approx(CLEAR_MARGIN)

    md_path = tmp_path / "reports" / "greedy.md"
    md = md_path.read_text()
    assert "# A/B greedy agreement: greedy" in md and "| off | ok |" in md and "| on | ok |" in md
    assert "6 prompts (custom)" in md and "max_tokens 8" in md
    # Both divergences are clear for the baseline (the fake's near tie is on the side's token).
    assert row["near_tie_divergences"] == 0
    assert "| on | 4/6 | 66.7% | 6.2 tokens | 8.0 tokens | 0 | 0/2 | 6/6 | yes |" in md
    assert "| off (baseline) | - | - | - | 8.0 tokens | 0 | - | 6/6 | - |" in md

    # Teacher-forced scoring: the fake tokenizes by words; expected figures from its rule.
    texts = greedy_agreement.teacher_forced_texts(3, 400)
    scored = [len(t["text"].split()) - 1 for t in texts]
    flips = sum(n // 5 for n in scored)
    positions = sum(scored)
    assert flips > 0
    for side in (off, on):
        assert [t["sha256"] for t in side["bench"]["teacher_forced"]] == [t["sha256"] for t in texts]
        assert [len(t["top1_ids"]) for t in side["bench"]["teacher_forced"]] == scored
    tf = row["teacher_forced"]
    assert tf["positions"] == positions and tf["flips"] == flips
    assert tf["top1_agreement"] == pytest.approx(1 - flips / positions)
    assert tf["confident_positions"] == positions  # the baseline leads clearly everywhere
    assert tf["confident_top1_agreement"] == pytest.approx(1 - flips / positions)
    shift = FLIPPED_TRUE_TOKEN_LOGPROB - TRUE_TOKEN_LOGPROB
    assert tf["perplexity_ratio_minus_1"] == pytest.approx(math.exp(-shift * flips / positions) - 1)
    assert tf["mean_abs_true_logprob_delta"] == pytest.approx(abs(shift) * flips / positions)
    assert tf["flip_baseline_margin_median"] == pytest.approx(CLEAR_MARGIN)
    assert "## Teacher-forced scoring of fixed texts" in md
    assert f"| on | {positions} | {1 - flips / positions:.2%} |" in md
    assert "### on: differing prompts" in md and "2 (one side ended)" in md
    assert not (tmp_path / "reports" / "greedy.png").exists()

    md_path.unlink()
    assert ab.main(["--report-only", str(tmp_path / "reports" / "greedy.json")]) == 0
    assert md_path.read_text() == md


def test_ab_greedy_marks_a_side_with_problems_invalid(tmp_path):
    launcher = _launcher(tmp_path, "serve.sh", f'exec "{PYTHON}" "{FAKE_SERVER}" "$@"\n')
    code = ab.main([
        "--side", "off", "GOVINDA_DISABLE=1", "--side", "on", "GOVINDA_DISABLE=1", "--workload", "greedy",
        "--name", "bad", "--model", "fake-model", "--server-cmd", launcher, "--port", str(free_port()),
        "--log-pattern", "overlay=govinda:", "--stop-grace", "5", "--work-dir", str(tmp_path / "work"),
        "--report-dir", str(tmp_path / "reports"),
    ])
    assert code == 0  # both sides ran; nothing required the overlay
    result = json.loads((tmp_path / "reports" / "bad.json").read_text())
    (row,) = result["agreement"]
    assert row["identical"] == row["prompts"] == len(greedy_agreement.DEFAULT_PROMPTS) and row["valid"]

    result["sides"][1]["problems"] = ["log pattern overlay matched 0 lines"]
    (tmp_path / "reports" / "bad.json").write_text(json.dumps(result))
    assert ab.main(["--report-only", str(tmp_path / "reports" / "bad.json")]) == 2
    rebuilt = json.loads((tmp_path / "reports" / "bad.json").read_text())
    assert rebuilt["agreement"][0]["valid"] is False
    assert "| NO (see Sides) |" in (tmp_path / "reports" / "bad.md").read_text()


def test_ab_greedy_config_validation(tmp_path):
    common = ["--side", "a", "X=1", "--side", "b", "X=2", "--model", "m"]
    config = ab.parse_config(common + ["--workload", "greedy"])
    assert config.workload() == "greedy" and config.bench == {"workload": "greedy"}
    assert ab.parse_config(common).workload() == "tiers"
    with pytest.raises(ValueError, match="tiers workload only"):
        ab.parse_config(common + ["--workload", "greedy", "--output-len", "8"])
    for bench, message in (({"workload": "greedy", "input_lens": [16]}, "unknown keys"),
                           ({"workload": "beam"}, "unknown workload"),
                           ({"max_tokens": 8}, "unknown keys")):  # greedy keys need workload: greedy
        sides = _sides_file(tmp_path, {"model": "m", "bench": bench, "sides": [{"name": "a"}, {"name": "b"}]})
        with pytest.raises(ValueError, match=message):
            ab.parse_config(["--sides", sides])


# ----------------------------------------------------------------------------- H200 sides file


def test_smollm2_sides_file(tmp_path):
    path = REPO_ROOT / "scripts" / "h200" / "ab_smollm2_agreement.yaml"
    config = ab.parse_config(["--sides", str(path)])
    assert config.workload() == "greedy" and config.bench["max_tokens"] == 64
    assert config.model == "/tmp/smollm2-hf" and config.port == 8012 and config.health_timeout_s == 300
    assert config.server_command == ["scripts/start_vllm_dev.sh"]
    assert config.env == {"GOVINDA_VLLM_CMD": "python3 -m vllm.entrypoints.cli.main"}
    assert config.server_args == ["--served-model-name", "m", "--max-model-len", "8192"]
    assert config.bench["teacher_forced_texts"] > 0
    assert [s.name for s in config.sides] == ["overlay_off", "overlay_on", "triton_bf16", "upstream_int8"]
    assert config.baseline_name() == "overlay_off"
    assert [s.env for s in config.sides] == [{"GOVINDA_DISABLE": "1"}, {"GOVINDA_DISABLE": "0"}] + [{"GOVINDA_DISABLE": "1"}] * 2
    assert config.sides[2].server_args == ["--attention-backend", "TRITON_ATTN"]
    assert config.sides[3].server_args == ["--attention-backend", "TRITON_ATTN", "--kv-cache-dtype", "int8_per_token_head"]
    on = {p.name: p for p in config.sides[1].log_patterns}
    assert on["govinda_status"].min == 2 and on["govinda_dispatch"].min == 1
    off = {p.name: p for p in config.sides[0].log_patterns}
    assert off["govinda_status"].max == 0 and "govinda_dispatch" not in off

    # Through the dev script, the sides file's --max-model-len comes after the locked 32768:
    # vLLM's parser keeps the last value, and SmolLM2 (max_position_embeddings 8192) needs it.
    code, dump = _run_script(tmp_path, "start_vllm_dev.sh", config.model, str(config.port), *config.server_args)
    assert code == 0
    argv = dump["argv"]
    assert argv[:6] == ["serve", "/tmp/smollm2-hf", "--port", "8012", "--max-model-len", "32768"]
    assert argv[-2:] == ["--max-model-len", "8192"]


def test_smollm2_fp16_sides_file():
    bf16 = ab.parse_config(["--sides", str(REPO_ROOT / "scripts" / "h200" / "ab_smollm2_agreement.yaml")])
    fp16 = ab.parse_config(["--sides", str(REPO_ROOT / "scripts" / "h200" / "ab_smollm2_agreement_fp16.yaml")])
    # The same model, workload and launcher as the bf16 run; only the dtype differs.
    assert fp16.server_args == bf16.server_args + ["--dtype", "float16"]
    assert (fp16.model, fp16.port, fp16.server_command, fp16.env, fp16.bench) == (
        bf16.model, bf16.port, bf16.server_command, bf16.env, bf16.bench)
    assert [s.env for s in fp16.sides] == [{"GOVINDA_DISABLE": "1"}, {"GOVINDA_DISABLE": "0"}]
    assert fp16.sides[0].server_args == fp16.sides[1].server_args == []
    on = {p.name: p for p in fp16.sides[1].log_patterns}
    assert on["govinda_status"].min == 2 and on["govinda_dispatch"].min == 1
