"""Greedy-continuation agreement between two OpenAI-compatible servers (e.g. overlay off vs on).

Collect one side (a running server)::

    python -m bench.greedy_agreement --url http://127.0.0.1:8012 --out off.json [--max-tokens 64]
        [--prompts-file prompts.json] [--repeats 2]

Compare two collected sides (the first is the baseline)::

    python -m bench.greedy_agreement compare off.json on.json [--json cmp.json] [--md cmp.md]

``python -m bench.ab`` runs the collection for every side with ``bench: {workload: greedy, ...}``.

Each prompt goes to ``/v1/completions`` as plain text (no chat template), one request at a time
(so both sides decode with the same batch shape), with ``temperature: 0`` (greedy),
``repetition_penalty: 1.0``, ``max_tokens`` and EOS honoured (a continuation may end early, as in
real serving). The request also asks for:

- ``return_token_ids: true``: vLLM's OpenAI server (0.18.1 and 0.26) then returns the generated
  ids in ``choices[0].token_ids``, so agreement is measured on tokens, not on detokenized text;
- ``logprobs: 2`` with ``return_tokens_as_token_ids: true``: per generated token the top two
  candidates, keyed ``"token_id:N"``. They are the fallback source of the ids, and they give the
  margin (logprob of the first minus the second candidate) where two sides diverge: a flip
  between near-tied candidates is rounding; a flip with a large margin is not.

Without ids (a server that ignores both options) texts are compared character by character and
the report says so.

Teacher-forced scoring (``teacher_forced_texts > 0``, ``--teacher-forced-texts N``): greedy
continuations of a small model part at the first near tie, so "identical continuations" is a coarse
measure. Each side therefore also scores the same fixed texts (slices of the prose and code that
every CPython install carries, ``bench/accuracy/text_corpus.py``) with ``max_tokens: 1`` and
``prompt_logprobs: 2``: per position the logprob of the true next token and the top two
candidates. vLLM reads no prefix cache for such requests and the prompt's K/V go through the KV
cache (for the overlay: INT8, read back by the prefill kernel), so this is the CPU accuracy
study's teacher-forced protocol on the served stack: top-1 agreement (all positions, and those
where the baseline's top candidate leads by >= 0.1 probability), perplexity ratio and KL-free
logprob deltas.

The default prompt set (``DEFAULT_PROMPTS``) is 24 short English prompts chosen so that a small
instruct model (SmolLM2-135M-Instruct) writes on rather than stopping at once: facts, stories,
lists, a letter, code, SQL, instructions phrased as plain text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from bench import openai_http

SCHEMA = "govinda.greedy/1"
COMPARISON_SCHEMA = "govinda.greedy_comparison/1"
TOKEN_ID_PREFIX = "token_id:"
# Around the divergence point, how much of each continuation a report shows.
CONTEXT_CHARS = 40
DIVERGED_CHARS = 80
PROMPT_CHARS = 60

DEFAULT_PROMPTS = (
    "The capital of France is",
    "Here is a simple recipe for pancakes:\n",
    "Once upon a time, in a small village by the sea,",
    "Question: What is photosynthesis?\nAnswer: Photosynthesis is",
    "Write a short poem about the moon.\n",
    "def fibonacci(n):\n",
    "The three primary colors are",
    "The sky looks blue during the day because",
    "List five fruits that are rich in vitamin C:\n1.",
    "Dear hiring manager,\n\nI am writing to apply for",
    "The main causes of the First World War were",
    "To make a good cup of tea, you should",
    "Translate to French: 'Good morning, how are you?'\n",
    "A healthy breakfast usually includes",
    "The difference between a virus and a bacterium is",
    "Here are some tips for learning a new language:\n-",
    "SELECT name, age FROM users WHERE",
    "In mathematics, a prime number is",
    "The weather today is sunny and warm, so we decided to",
    "Summarize the plot of Romeo and Juliet in two sentences.\n",
    "My favourite hobby is gardening because",
    "Water boils at 100 degrees Celsius, but at high altitude",
    "The steps to change a flat tyre are:\n1.",
    "If you could travel anywhere in the world, where would you go and why?\n",
)


def log(message: str) -> None:
    print(f"[greedy {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class GreedyConfig:
    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "/v1/completions"
    model: Optional[str] = None  # None: the first id of /v1/models
    prompts: Optional[List[str]] = None  # None: DEFAULT_PROMPTS
    max_tokens: int = 64
    top_logprobs: int = 2  # candidates per token for the divergence margin; 0: none requested
    repeats: int = 1  # > 1: send the whole set again, to see whether a side agrees with itself
    teacher_forced_texts: int = 0  # > 0: also score this many fixed texts (see the module docstring)
    teacher_forced_chars: int = 6000  # characters per scored text (~1.5K SmolLM2 tokens)
    request_timeout_s: float = 300.0
    extra_body: Dict[str, Any] = field(default_factory=dict)
    label: Optional[str] = None
    progress: bool = True

    def prompt_list(self) -> List[str]:
        return list(DEFAULT_PROMPTS) if self.prompts is None else [str(p) for p in self.prompts]

    def validate(self) -> None:
        if not self.prompt_list():
            raise ValueError("no prompts")
        if self.max_tokens < 1 or self.repeats < 1 or self.top_logprobs < 0:
            raise ValueError("max_tokens and repeats must be >= 1, top_logprobs >= 0")
        if self.teacher_forced_texts < 0 or self.teacher_forced_chars < 100:
            raise ValueError("teacher_forced_texts must be >= 0 and teacher_forced_chars >= 100")


# ----------------------------------------------------------------------------- client

def _token_id(token: Any) -> Optional[int]:
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        try:
            return int(token[len(TOKEN_ID_PREFIX):])
        except ValueError:
            return None
    return None


def parse_choice(choice: Dict[str, Any]) -> Dict[str, Any]:
    """Text, token ids, per-token top candidates ([[id, logprob], ...], best first) and text offsets."""
    logprobs = choice.get("logprobs") or {}
    ids_from_logprobs = [_token_id(t) for t in logprobs.get("tokens") or []]
    token_ids = choice.get("token_ids")
    if token_ids is None and ids_from_logprobs and None not in ids_from_logprobs:
        token_ids = ids_from_logprobs
    candidates = None
    if logprobs.get("top_logprobs"):
        candidates = []
        for step in logprobs["top_logprobs"]:
            ranked = sorted(((_token_id(t), lp) for t, lp in (step or {}).items()), key=lambda x: -x[1])
            # Keys that are not "token_id:N" (the server ignored return_tokens_as_token_ids) are dropped.
            candidates.append([[tid, lp] for tid, lp in ranked if tid is not None])
    return {
        "text": choice.get("text") or "",
        "token_ids": [int(t) for t in token_ids] if token_ids is not None else None,
        "finish_reason": choice.get("finish_reason"),
        "top_logprobs": candidates,
        # Where each token starts in the text: the report splits continuations at a token boundary.
        "text_offsets": logprobs.get("text_offset"),
    }


def complete(config: GreedyConfig, model: str, index: int, prompt: str) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": config.max_tokens,
        "temperature": 0.0,
        "repetition_penalty": 1.0,  # a model's generation_config must not change greedy decoding
        "return_token_ids": True,
    }
    if config.top_logprobs:
        body.update(logprobs=config.top_logprobs, return_tokens_as_token_ids=True)
    body.update(config.extra_body)
    record: Dict[str, Any] = {"index": index, "prompt": prompt, "error": ""}
    started = time.perf_counter()
    try:
        payload = openai_http.http_json(config.base_url.rstrip("/") + config.endpoint, body, config.request_timeout_s)
        choices = payload.get("choices") or []
        if not choices:
            raise RuntimeError(f"no choices in the response: {json.dumps(payload)[:300]}")
        record.update(parse_choice(choices[0]))
    except Exception as exc:  # connection reset, timeout, HTTP error, bad JSON: this prompt failed
        record.update(text="", token_ids=None, finish_reason=None, top_logprobs=None, text_offsets=None,
                      error=f"{type(exc).__name__}: {exc}")
    record["latency_s"] = round(time.perf_counter() - started, 4)
    return record


def run(config: GreedyConfig) -> Dict[str, Any]:
    """Send every prompt (``repeats`` times); returns the result dict written by ``--out``."""
    config.validate()
    prompts = config.prompt_list()
    model = config.model or openai_http.discover_model(config.base_url, config.request_timeout_s)
    passes: List[List[Dict[str, Any]]] = []
    for repeat in range(config.repeats):
        records = []
        for index, prompt in enumerate(prompts):
            record = complete(config, model, index, prompt)
            records.append(record)
            if config.progress:
                n = len(record["token_ids"]) if record["token_ids"] is not None else "?"
                state = f"FAILED {record['error'][:200]}" if record["error"] else f"{n} tokens ({record['finish_reason']})"
                log(f"pass {repeat + 1}/{config.repeats} prompt {index + 1}/{len(prompts)}: {state}")
        passes.append(records)
    scored: List[Dict[str, Any]] = []
    texts_error = ""
    try:
        texts = teacher_forced_texts(config.teacher_forced_texts, config.teacher_forced_chars)
    except Exception as exc:  # e.g. an interpreter without pydoc_data: keep the greedy results
        texts, texts_error = [], f"{type(exc).__name__}: {exc}"
        log(f"teacher-forced scoring skipped: {texts_error}")
    for index, text in enumerate(texts):
        record = score_text(config, model, index, text)
        scored.append(record)
        if config.progress:
            state = f"FAILED {record['error'][:200]}" if record["error"] else f"{len(record['top1_ids'])} positions"
            log(f"teacher-forced text {index + 1}/{config.teacher_forced_texts} ({text['source']}): {state}")
    result: Dict[str, Any] = {
        "schema": SCHEMA,
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "label": config.label,
        "base_url": config.base_url,
        "model_id": model,
        "prompt_set": "builtin" if config.prompts is None else "custom",
        "config": asdict(config),
        "completions": passes[0],
        "repeat_completions": passes[1:],
        "teacher_forced": scored,
        "teacher_forced_error": texts_error,
    }
    if len(passes) > 1:  # the noise floor: does the side agree with itself?
        result["self_agreement"] = [
            _summary_counts(compare_completions(passes[0], later)) for later in passes[1:]
        ]
    return result


# ----------------------------------------------------------------------------- teacher-forced scoring

# A baseline top candidate that leads its runner-up by at least this much probability is
# "confident" (the CPU accuracy study's definition): a flip there is not rounding.
CONFIDENT_PROBABILITY_GAP = 0.1
# A greedy divergence where the baseline's top two candidates are closer than this (nats) is a
# near tie: bf16 logits of a small model tie exactly or within one rounding step (0.125 at |logit|
# ~ 16-32) often, and any change of summation order may flip them.
NEAR_TIE_NATS = 0.5


def _text_corpus():
    from bench.accuracy import text_corpus

    return text_corpus


def teacher_forced_texts(count: int, chars: int) -> List[Dict[str, str]]:
    """``count`` slices of ``chars`` characters, alternating prose and code, evenly spaced in each.

    The text is what this interpreter's standard library ships, so both sides of an A/B on one
    machine score the same text; each slice's sha256 lets the comparison check that.
    """
    sources = list(_text_corpus().sources().values())
    texts = []
    for index in range(count):
        kind = index % len(sources)
        source = sources[kind]
        slot, slots = index // len(sources), len(range(kind, count, len(sources)))
        start = max(len(source.text) - chars, 0) * slot // (slots - 1) if slots > 1 else 0
        text = source.text[start:start + chars]
        texts.append({"source": source.name, "start": start, "text": text,
                      "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]})
    return texts


def parse_prompt_logprobs(choice: Dict[str, Any]) -> Dict[str, Any]:
    """Per scored position (the prompt's second token on): true token's logprob and the top two.

    vLLM returns ``prompt_logprobs`` as one entry per prompt token (``None`` for the first), each
    ``{"<token id>": {"logprob": x, "rank": r, ...}}`` holding the top ``k`` and the true token.
    """
    ids = choice.get("prompt_token_ids")
    entries = choice.get("prompt_logprobs")
    if ids is None or entries is None:
        raise RuntimeError("the server returned no prompt_token_ids / prompt_logprobs")
    if len(ids) != len(entries):
        raise RuntimeError(f"{len(ids)} prompt ids but {len(entries)} prompt_logprobs entries")
    true_logprobs, top1_ids, top1_logprobs, top2_logprobs = [], [], [], []
    for token_id, entry in zip(ids[1:], entries[1:]):
        entry = entry or {}
        ranked = sorted((v["rank"], int(k), v["logprob"]) for k, v in entry.items())
        if str(token_id) not in entry or len(ranked) < 2:
            raise RuntimeError(f"prompt_logprobs entry without the true token or two candidates: {entry}")
        true_logprobs.append(round(entry[str(token_id)]["logprob"], 5))
        top1_ids.append(ranked[0][1])
        top1_logprobs.append(round(ranked[0][2], 5))
        top2_logprobs.append(round(ranked[1][2], 5))
    return {"token_ids": [int(t) for t in ids], "true_logprobs": true_logprobs, "top1_ids": top1_ids,
            "top1_logprobs": top1_logprobs, "top2_logprobs": top2_logprobs}


def score_text(config: GreedyConfig, model: str, index: int, text: Dict[str, str]) -> Dict[str, Any]:
    body = {"model": model, "prompt": text["text"], "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 2, "return_token_ids": True}
    record: Dict[str, Any] = {"index": index, "source": text["source"], "start": text["start"],
                              "sha256": text["sha256"], "error": ""}
    try:
        payload = openai_http.http_json(config.base_url.rstrip("/") + config.endpoint, body, config.request_timeout_s)
        record.update(parse_prompt_logprobs((payload.get("choices") or [{}])[0]))
    except Exception as exc:  # a failed text is reported, never silently dropped
        record["error"] = f"{type(exc).__name__}: {exc}"
    return record


def compare_teacher_forced(baseline: List[Dict[str, Any]], other: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Position-by-position agreement of two sides' scores of the same texts."""
    if [r["sha256"] for r in baseline] != [r["sha256"] for r in other]:
        return {"error": "the two sides scored different texts"}
    positions = agree = confident = confident_agree = 0
    nll_baseline = nll_side = abs_delta = 0.0
    flip_margins: List[float] = []
    failed, mismatched = [], []
    for a, b in zip(baseline, other):
        if a["error"] or b["error"]:
            failed.append(a["index"])
            continue
        if a["token_ids"] != b["token_ids"]:  # same text, different tokenizer: not comparable
            mismatched.append(a["index"])
            continue
        for i, (id_a, id_b) in enumerate(zip(a["top1_ids"], b["top1_ids"])):
            same = id_a == id_b
            positions += 1
            agree += same
            gap = math.exp(a["top1_logprobs"][i]) - math.exp(a["top2_logprobs"][i])
            if gap >= CONFIDENT_PROBABILITY_GAP:
                confident += 1
                confident_agree += same
            if not same:
                flip_margins.append(a["top1_logprobs"][i] - a["top2_logprobs"][i])
            nll_baseline -= a["true_logprobs"][i]
            nll_side -= b["true_logprobs"][i]
            abs_delta += abs(a["true_logprobs"][i] - b["true_logprobs"][i])
    if not positions:
        return {"error": "no comparable positions", "failed_indices": failed, "mismatched_indices": mismatched}
    flip_margins.sort()
    return {
        "texts": len(baseline),
        "failed_indices": failed,
        "mismatched_indices": mismatched,
        "positions": positions,
        "top1_agreement": agree / positions,
        "confident_positions": confident,
        "confident_top1_agreement": confident_agree / confident if confident else None,
        "baseline_perplexity": math.exp(nll_baseline / positions),
        "perplexity_ratio_minus_1": math.exp((nll_side - nll_baseline) / positions) - 1.0,
        "mean_abs_true_logprob_delta": abs_delta / positions,
        "flips": len(flip_margins),
        "flip_baseline_margin_median": float(np.median(flip_margins)) if flip_margins else None,
        "flip_baseline_margin_max": flip_margins[-1] if flip_margins else None,
    }


# ----------------------------------------------------------------------------- comparison


def common_prefix_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _margin(candidates: Optional[List[List[Any]]], position: int) -> Optional[float]:
    """logprob(first) - logprob(second) at a position, when two candidates were returned."""
    if not candidates or position >= len(candidates) or len(candidates[position]) < 2:
        return None
    return round(candidates[position][0][1] - candidates[position][1][1], 4)


def _snippet(text: str, split_at: int) -> str:
    """The continuation around the divergence; '‖' marks where the sides part."""
    start = max(0, split_at - CONTEXT_CHARS)
    end = split_at + DIVERGED_CHARS
    return ("…" if start else "") + text[start:split_at] + "‖" + text[split_at:end] + ("…" if end < len(text) else "")


def compare_completions(baseline: List[Dict[str, Any]], other: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Prompt-by-prompt agreement of ``other`` with ``baseline`` (records as ``run`` writes them)."""
    if [r["prompt"] for r in baseline] != [r["prompt"] for r in other]:
        return {"error": "the two runs used different prompts", "prompts": len(baseline)}
    pairs = [(a, b) for a, b in zip(baseline, other) if not a["error"] and not b["error"]]
    # One unit for the whole comparison: tokens when every pair has ids, else characters.
    by_tokens = bool(pairs) and all(a["token_ids"] is not None and b["token_ids"] is not None for a, b in pairs)
    unit = "tokens" if by_tokens else "chars"
    prefixes, baseline_lengths, divergences = [], [], []
    identical = 0
    for a, b in pairs:
        seq_a = a["token_ids"] if by_tokens else a["text"]
        seq_b = b["token_ids"] if by_tokens else b["text"]
        prefix = common_prefix_length(seq_a, seq_b)
        prefixes.append(prefix)
        baseline_lengths.append(len(seq_a))
        if seq_a == seq_b:
            identical += 1
            continue
        split_char = common_prefix_length(a["text"], b["text"])
        offsets = a.get("text_offsets") or []
        if by_tokens and prefix < len(offsets):
            split_char = min(split_char, offsets[prefix])  # the start of the first differing token
        divergence: Dict[str, Any] = {
            "index": a["index"],
            "prompt": a["prompt"],
            "position": prefix,
            "baseline_length": len(seq_a),
            "side_length": len(seq_b),
            "baseline_finish_reason": a["finish_reason"],
            "side_finish_reason": b["finish_reason"],
            # Both continuations agree up to `position`, then one ends (EOS / max_tokens) or differs.
            "kind": "ended" if prefix == min(len(seq_a), len(seq_b)) else "differs",
            "baseline_margin": _margin(a.get("top_logprobs"), prefix),
            "side_margin": _margin(b.get("top_logprobs"), prefix),
            "baseline_continuation": _snippet(a["text"], split_char),
            "side_continuation": _snippet(b["text"], split_char),
        }
        if by_tokens:
            divergence["baseline_token"] = seq_a[prefix] if prefix < len(seq_a) else None
            divergence["side_token"] = seq_b[prefix] if prefix < len(seq_b) else None
        divergences.append(divergence)
    failed = [a["index"] for a, b in zip(baseline, other) if a["error"] or b["error"]]
    return {
        "prompts": len(baseline),
        "compared": len(pairs),
        "failed": len(failed),
        "failed_indices": failed,
        "identical": identical,
        # Over all prompts: a failed request counts as a disagreement.
        "fraction": identical / len(baseline) if baseline else 0.0,
        "prefix_unit": unit,
        "mean_common_prefix": sum(prefixes) / len(prefixes) if prefixes else None,
        "mean_baseline_length": sum(baseline_lengths) / len(baseline_lengths) if baseline_lengths else None,
        # Divergences where the baseline's top two candidates were within NEAR_TIE_NATS.
        "near_tie_divergences": sum(
            1 for d in divergences if d["baseline_margin"] is not None and d["baseline_margin"] < NEAR_TIE_NATS
        ),
        "divergences": divergences,
    }


def _summary_counts(comparison: Dict[str, Any]) -> Dict[str, Any]:
    return {k: comparison.get(k) for k in ("prompts", "identical", "fraction", "failed", "prefix_unit",
                                            "mean_common_prefix", "error")}


def compare(baseline: Dict[str, Any], other: Dict[str, Any]) -> Dict[str, Any]:
    """Compare two results of ``run`` (first pass of each); the first is the baseline."""
    comparison = compare_completions(baseline["completions"], other["completions"])
    texts_errors = [e for e in (baseline.get("teacher_forced_error"), other.get("teacher_forced_error")) if e]
    if texts_errors:  # scoring was asked for but could not run: say why rather than "not measured"
        comparison["teacher_forced"] = {"error": "; ".join(texts_errors)}
    elif baseline.get("teacher_forced") and other.get("teacher_forced"):
        comparison["teacher_forced"] = compare_teacher_forced(baseline["teacher_forced"], other["teacher_forced"])
    return {
        "schema": COMPARISON_SCHEMA,
        "baseline": baseline.get("label") or "baseline",
        "side": other.get("label") or "side",
        "max_tokens": (baseline.get("config") or {}).get("max_tokens"),
        "baseline_self_agreement": baseline.get("self_agreement"),
        "side_self_agreement": other.get("self_agreement"),
        **comparison,
    }


# ----------------------------------------------------------------------------- reporting


def _cell(text: Any) -> str:
    """Markdown-table-safe text: one line, no column breaks."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "⏎")


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def self_agreement_text(summaries: Optional[List[Dict[str, Any]]]) -> str:
    if not summaries:
        return "not measured"
    return ", ".join(
        "error" if s.get("error") else f"{s['identical']}/{s['prompts']}" for s in summaries
    )


def summary_line(comparison: Dict[str, Any]) -> str:
    if comparison.get("error"):
        return f"not comparable: {comparison['error']}"
    differing = comparison["prompts"] - comparison["identical"] - comparison["failed"]
    return (
        f"{comparison['identical']}/{comparison['prompts']} identical ({comparison['fraction']:.1%}), "
        f"mean common prefix {_fmt(comparison['mean_common_prefix'])} {comparison['prefix_unit']} "
        f"(baseline continuations average {_fmt(comparison['mean_baseline_length'])}), "
        f"{comparison['failed']} failed; {comparison.get('near_tie_divergences', 0)}/{differing} divergences at a "
        f"near tie (baseline top-2 within {NEAR_TIE_NATS} nats)"
    )


def teacher_forced_line(scores: Optional[Dict[str, Any]]) -> str:
    if not scores:
        return "not measured"
    if scores.get("error"):
        return f"not comparable: {scores['error']}"
    confident = scores["confident_top1_agreement"]
    return (
        f"top-1 agreement {scores['top1_agreement']:.2%} over {scores['positions']} positions "
        f"({'n/a' if confident is None else f'{confident:.2%}'} over the {scores['confident_positions']} confident ones), "
        f"perplexity ratio - 1 {scores['perplexity_ratio_minus_1']:+.3%}, "
        f"mean |delta logprob| of the true token {scores['mean_abs_true_logprob_delta']:.4f} nats, "
        f"{scores['flips']} flips (baseline margin median {_fmt(scores['flip_baseline_margin_median'], 3)}, "
        f"max {_fmt(scores['flip_baseline_margin_max'], 3)} nats)"
        + (f", texts failed {scores['failed_indices']}" if scores["failed_indices"] else "")
        + (f", texts tokenized differently {scores['mismatched_indices']}" if scores["mismatched_indices"] else "")
    )


def divergence_markdown(comparison: Dict[str, Any], baseline: str, side: str) -> List[str]:
    """The table of prompts whose continuations differ ('‖' marks the split)."""
    divergences = comparison.get("divergences") or []
    if not divergences:
        return ["No differing continuations."]
    unit = comparison["prefix_unit"]
    lines = [
        f"Margin: logprob of the first minus the second candidate at the divergence (nats; small = near tie). "
        f"'‖' marks where the continuations part; ⏎ is a newline.",
        "",
        f"| # | prompt | diverges at ({unit}) | {baseline} margin | {side} margin | {_cell(baseline)} | {_cell(side)} |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in divergences:
        where = f"{d['position']}" + (" (one side ended)" if d["kind"] == "ended" else "")
        lines.append(
            f"| {d['index']} | {_cell(d['prompt'][:PROMPT_CHARS])} | {where} | {_fmt(d['baseline_margin'], 3)} | "
            f"{_fmt(d['side_margin'], 3)} | {_cell(d['baseline_continuation'])} | {_cell(d['side_continuation'])} |"
        )
    return lines


def comparison_markdown(comparison: Dict[str, Any]) -> str:
    baseline, side = comparison["baseline"], comparison["side"]
    lines = [
        f"# Greedy agreement: {side} vs {baseline} (baseline)",
        "",
        f"- {summary_line(comparison)}",
        f"- max_tokens {comparison.get('max_tokens')}, temperature 0, one request at a time",
        f"- self-agreement over repeats: {baseline}: {self_agreement_text(comparison.get('baseline_self_agreement'))}; "
        f"{side}: {self_agreement_text(comparison.get('side_self_agreement'))}",
        f"- teacher-forced scoring of fixed texts: {teacher_forced_line(comparison.get('teacher_forced'))}",
        "",
    ]
    if not comparison.get("error"):
        lines += divergence_markdown(comparison, baseline, side)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- CLI


def load_prompts(path: str) -> List[str]:
    """A JSON list of strings, or a text file with one prompt per line ('\\n' escapes allowed)."""
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".json"):
        prompts = json.loads(text)
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"{path}: expected a JSON list of strings")
        return prompts
    return [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]


def _collect_main(argv: List[str]) -> int:
    d = GreedyConfig()
    p = argparse.ArgumentParser(description="collect greedy continuations from one server (see the module docstring)")
    p.add_argument("--url", default=d.base_url, help="server root, e.g. http://127.0.0.1:8012")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--model", default=None, help="model name for requests (default: first of /v1/models)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--prompts-file", help="JSON list of strings or one prompt per line (default: the built-in set)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="send the set this many times (self-agreement)")
    p.add_argument("--top-logprobs", type=int, default=d.top_logprobs)
    p.add_argument("--teacher-forced-texts", type=int, default=d.teacher_forced_texts,
                   help="also score this many fixed texts with prompt_logprobs (0: off)")
    p.add_argument("--teacher-forced-chars", type=int, default=d.teacher_forced_chars)
    p.add_argument("--label", default=None, help="name of this side in reports (compare: default the file name)")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    config = GreedyConfig(
        base_url=args.url, model=args.model, max_tokens=args.max_tokens, repeats=args.repeats,
        prompts=load_prompts(args.prompts_file) if args.prompts_file else None,
        top_logprobs=args.top_logprobs, label=args.label, progress=not args.quiet,
        teacher_forced_texts=args.teacher_forced_texts, teacher_forced_chars=args.teacher_forced_chars,
    )
    result = run(config)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    failed = sum(1 for r in result["completions"] + result["teacher_forced"] if r["error"])
    log(f"wrote {args.out}: {len(result['completions'])} prompts, {len(result['teacher_forced'])} scored texts, "
        f"{failed} failed")
    return 0 if failed == 0 else 1


def _compare_main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="greedy_agreement.py compare", description="compare two collected sides")
    p.add_argument("baseline", help="result JSON of the baseline side")
    p.add_argument("side", help="result JSON of the side compared with it")
    p.add_argument("--json", help="write the comparison JSON here")
    p.add_argument("--md", help="write the Markdown report here (it is printed either way)")
    args = p.parse_args(argv)
    results = [json.loads(Path(path).read_text(encoding="utf-8")) for path in (args.baseline, args.side)]
    for result, path in zip(results, (args.baseline, args.side)):
        result["label"] = result.get("label") or Path(path).stem
    comparison = compare(*results)
    markdown = comparison_markdown(comparison)
    print(markdown)
    if args.json:
        Path(args.json).write_text(json.dumps(comparison, indent=1), encoding="utf-8")
    if args.md:
        Path(args.md).write_text(markdown, encoding="utf-8")
    return 0 if not comparison.get("error") else 2


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        return _compare_main(argv[1:])
    return _collect_main(argv)


if __name__ == "__main__":
    sys.exit(main())
