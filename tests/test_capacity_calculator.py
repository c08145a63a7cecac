"""``python -m govinda_patch capacity`` (issue #27) against the real vLLM of this line, on the
simulated DCU: the KV bytes per token and hybrid page padding of stock bf16 and of the overlay for
the Qwen3.5-27B shape and the dense Llama-3-8B shape, the token and request counts vLLM's own pool
arithmetic gives, and, on vLLM 0.26 (the line the H200 ran), the counts the H200 servers logged at
start-up for the same KV memory (reports/h200/*.log): within 1 %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.kv_log import read_kv_cache_facts
from govinda_patch import capacity, model_weights
from overlay_testing import REPO, VLLM_VERSION, child_env, logged_shape_key, run_module, vllm_is, warm_python

QWEN35 = REPO / "tests" / "models" / "qwen3_5-27b-shape"
LLAMA8B = REPO / "scripts" / "h200" / "models" / "llama8b-shape"
LOGS = REPO / "reports" / "h200"
GIB = 1 << 30
# The model directories of the H200 runs whose configs are committed here.
LOG_MODELS = {".device/models/qwen3_5-27b-shape": QWEN35, "/tmp/llama8b-shape": LLAMA8B}


def logged_runs(model_dir: Path) -> list[dict]:
    """Every committed H200 server log of this model with the default KV dtype: which side (the
    overlay's INT8 pages or stock), the KV memory, the tokens vLLM logged, the weights it loaded."""
    runs = []
    for log in sorted(LOGS.glob("*.log")):
        text = log.read_text(errors="replace")
        model = next((name for name in LOG_MODELS if f"'model': '{name}'" in text), None)
        facts = read_kv_cache_facts(log)
        if model is None or LOG_MODELS[model] != model_dir or "tokens" not in facts or "available_gib" not in facts:
            continue
        if "'kv_cache_dtype'" in text:  # upstream INT8: not a side of the calculator
            continue
        runs.append({"log": log.name, "side": "overlay" if "int8_pages" in facts else "stock", **facts})
    return runs


def _config(model_dir: Path) -> dict:
    data = json.loads((model_dir / "config.json").read_text())
    return data.get("text_config", data)


@pytest.fixture(scope="module")
def dcu(tmp_path_factory) -> dict:
    return child_env(tmp_path_factory.mktemp("govinda-cache"), dcu=True)


@pytest.fixture(scope="module")
def warm_probes():
    """The probes that govinda_patch.capacity and int8.launch_shape start (``python -m MODULE ARG``)
    run forked from the warm interpreter, as run_child's children do: each still starts like a new
    interpreter and imports the installed vLLM itself, without importing torch and transformers again."""

    def run(command, env=None, cwd=None, timeout=None, **_):
        assert command[:2] == [sys.executable, "-m"], command
        return run_module(command[2], command[3:], env, timeout=timeout, cwd=Path(cwd) if cwd else Path.cwd())

    from govinda_patch.int8 import launch_shape

    probes = SimpleNamespace(run=run, DEVNULL=subprocess.DEVNULL, TimeoutExpired=subprocess.TimeoutExpired)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity, "subprocess", probes)
        patch.setattr(launch_shape, "subprocess", probes)
        yield


@pytest.fixture(scope="module")
def qwen35(dcu, warm_probes) -> tuple[dict, dict]:
    runs = logged_runs(QWEN35)
    request = {"model": str(QWEN35), "max_model_len": 32768, "gpu_memory_utilization": 0.9, "language_model_only": True,
               "gpu_mem_gib": 64, "overhead_gib": 4.76, "weights_gib": None, "request_lens": [8448, 16640],
               "kv_points": sorted({int(r["available_gib"] * GIB) for r in runs})}
    return request, capacity.compute(request, dcu)


@pytest.fixture(scope="module")
def llama8b(dcu, tmp_path_factory) -> tuple[list, dict]:
    """The dense shape through the command line (JSON output), at the KV memory of its H200 logs."""
    runs = logged_runs(LLAMA8B)
    (memory,) = {r["available_gib"] for r in runs}
    # Through the warm interpreter's launcher, which also serves the two probes the command starts.
    python = warm_python(dcu) or sys.executable
    command = [python, "-m", "govinda_patch", "capacity", str(LLAMA8B), "--kv-cache-memory-gib", str(memory),
               "--request-len", "8448", "--json"]
    done = subprocess.run(command, env=dcu, capture_output=True, text=True, timeout=900, cwd=str(REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    return command, json.loads(done.stdout)


def _int8_token_bytes(config: dict, layers: int) -> int:
    return layers * 2 * config["num_key_value_heads"] * (config["head_dim"] + 4)


def _bf16_token_bytes(config: dict, layers: int) -> int:
    return layers * 2 * config["num_key_value_heads"] * config["head_dim"] * 2


def test_qwen35_pages_padding_and_capacity(qwen35):
    request, results = qwen35
    stock, overlay = results["stock"], results["overlay"]
    config = _config(QWEN35)
    attention = sum(kind == "full_attention" for kind in config["layer_types"])
    assert (stock["attention_layers"], stock["mamba_layers"]) == (attention, config["num_hidden_layers"] - attention)
    assert stock["vllm"] == overlay["vllm"] == str(VLLM_VERSION) and stock["platform"] == "RocmPlatform"
    # Stock: bf16 pages of vLLM's own backend; the overlay: its INT8 spec, the whole group applied.
    assert stock["kv_dtype"] == "bfloat16" and stock["overlay"] == {"live": False}
    assert overlay["kv_dtype"] == "int8" and overlay["backend"] == "CUSTOM" and "not_served" not in overlay
    # Every patch applied except the vendor platform's priority patch, which has no vllm_hcu to target here.
    patches = overlay["overlay"]["patches"]
    assert patches.pop("int8_backend_priority_hcu") == "skipped-platform"
    assert set(patches.values()) == {"applied"}
    assert stock["token_bytes"] == stock["token_bytes_unpadded"] == _bf16_token_bytes(config, attention)
    assert overlay["token_bytes"] == overlay["token_bytes_unpadded"] == _int8_token_bytes(config, attention)
    # Hybrid alignment: one page size for attention and mamba state, the attention block grown until
    # its page holds a mamba layer's state (padding under one 16-token step of the attention page).
    mamba_page = stock["request_state_bytes_unpadded"] / stock["mamba_layers"]
    for side, per_token in ((stock, _bf16_token_bytes(config, 1)), (overlay, _int8_token_bytes(config, 1))):
        assert side["page_bytes"] == side["block_size"] * per_token
        assert 0 <= side["page_bytes"] - mamba_page < 16 * per_token
        assert side["request_state_bytes"] >= side["request_state_bytes_unpadded"]
        assert side["request_state_bytes"] % side["page_bytes"] == 0
    assert overlay["block_size"] > stock["block_size"]
    # The budget: vLLM's accounting with the weights counted from the config.
    weights = stock["weights"]
    assert weights["source"] == "config" and weights["bytes"] == 2 * weights["parameters"]
    assert stock["budget"]["kv_bytes"] == int(64 * GIB * 0.9) - weights["bytes"] - int(4.76 * GIB)
    s, o = stock["capacity"], overlay["capacity"]
    assert s["fits"] and o["fits"] and s["num_blocks"] >= 1
    # INT8 halves the attention bytes, not the mamba state a request carries: less than 2x requests.
    assert 1.4 < o["requests_at"]["8448"] / s["requests_at"]["8448"] < 2.0
    assert o["requests_at"]["16640"] > s["requests_at"]["16640"] > 1
    assert o["max_concurrency"] > s["max_concurrency"] and s["requests"] == int(s["max_concurrency"])
    text = capacity.render(results, request)
    assert f"| KV bytes per token, all attention layers, hybrid page padding included | {stock['token_bytes']:,.0f} | " \
           f"{overlay['token_bytes']:,.0f} |" in text
    assert "| requests of 8,448 tokens that fit |" in text and "mamba state per request" in text


def test_dense_pages_and_capacity_through_the_cli(llama8b):
    _, results = llama8b
    stock, overlay = results["stock"], results["overlay"]
    config = _config(LLAMA8B)
    layers = config["num_hidden_layers"]
    assert stock["mamba_layers"] == 0 and stock["attention_layers"] == layers
    assert stock["token_bytes"] == _bf16_token_bytes(config, layers)
    assert overlay["token_bytes"] == _int8_token_bytes(config, layers) and overlay["kv_dtype"] == "int8"
    for side in (stock, overlay):
        cap = side["capacity"]
        # One group of every layer: the pool holds kv // (page x layers) blocks of block_size tokens.
        blocks = cap["kv_bytes"] // (side["page_bytes"] * layers)
        assert cap["num_blocks"] == blocks and cap["tokens"] == blocks * side["block_size"]
        assert cap["max_concurrency"] == pytest.approx(cap["tokens"] / 32768)
        assert cap["requests_at"]["8448"] == pytest.approx(blocks / -(-8448 // side["block_size"]))
    assert "mamba state per request" not in capacity.render(results, {"model": str(LLAMA8B), "max_model_len": 32768})


def _within(predicted: float, logged: float, tolerance: float = 0.01) -> bool:
    return abs(predicted - logged) <= tolerance * logged


def test_weights_counted_from_the_config_match_what_vllm_loaded(qwen35, llama8b):
    for (_, results), model in ((qwen35, QWEN35), (llama8b, LLAMA8B)):
        counted = results["stock"]["weights"]["bytes"] / GIB
        for run in logged_runs(model):
            assert _within(counted, run["weights_gib"]), (run["log"], counted, run["weights_gib"])


def test_token_counts_match_the_h200_logs(qwen35, llama8b):
    if not vllm_is(">=0.26,<0.27"):
        pytest.skip("the H200 logs are vLLM 0.26's; other lines count the pool their own way")
    checked = []
    _, results = qwen35
    for run in logged_runs(QWEN35):
        point = next(p for p in results[run["side"]]["points"] if p["kv_bytes"] == int(run["available_gib"] * GIB))
        checked.append((run["log"], point["tokens"], run["tokens"]))
    _, results = llama8b
    for run in logged_runs(LLAMA8B):
        checked.append((run["log"], results[run["side"]]["capacity"]["tokens"], run["tokens"]))
    assert {log for log, _, _ in checked} >= {"serve64_govinda.log", "serve64_triton_bf16.log",
                                              "serve64_bench_serve_fa3_bf16.log", "dense128_bench_serve_govinda.log",
                                              "dense128_bench_serve_fa3_bf16.log"}
    off = [(log, predicted, logged) for log, predicted, logged in checked if not _within(predicted, logged)]
    assert off == [], off


def _args(*words: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    capacity.add_arguments(parser)
    return parser.parse_args(list(words))


def test_bad_requests_get_one_clear_line(tmp_path, capsys):
    assert capacity.main(_args(str(tmp_path))) == 2
    assert "give --gpu-mem-gib" in capsys.readouterr().err
    assert capacity.main(_args(str(tmp_path), "--gpu-mem-gib", "64")) == 2
    assert "config.json: no such file" in capsys.readouterr().err
    assert capacity.main(_args(str(QWEN35), "--gpu-mem-gib", "64", "--gpu-memory-utilization", "1.5")) == 2
    assert "must be in (0, 1]" in capsys.readouterr().err


def test_weight_count_refuses_what_it_does_not_cover():
    def model(text: dict, **top):
        text_config = SimpleNamespace(**text)
        hf_config = SimpleNamespace(**top) if top else text_config
        return SimpleNamespace(hf_text_config=text_config, hf_config=hf_config, get_head_size=lambda: 128,
                               dtype=SimpleNamespace(itemsize=2), use_mla=False)

    dense = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 100, "model_type": "llama"}
    counted = model_weights.parameter_count(model(dense), language_model_only=False)
    assert counted["bytes"] == 2 * counted["parameters"] and counted["family"] == "dense decoder"
    tied = model_weights.parameter_count(model(dict(dense, tie_word_embeddings=True)), language_model_only=False)
    assert counted["parameters"] - tied["parameters"] == 128 * 64  # the LM head, vocabulary padded to 64
    for text, top, why in ((dict(dense, num_experts=8), {}, "mixture-of-experts"),
                           (dict(dense, kv_lora_rank=512), {}, "MLA"),
                           (dict(dense, layer_types=["sliding_attention"] * 2), {}, "layer types"),
                           (dense, {"vision_config": {}}, "vision tower")):
        with pytest.raises(model_weights.UnsupportedModel, match=why):
            model_weights.parameter_count(model(text, **top), language_model_only=False)
    # The vision tower is out of the count when vLLM serves the language model only.
    assert model_weights.parameter_count(model(dense, vision_config={}), language_model_only=True)["parameters"] == \
        counted["parameters"]


def test_the_launch_shape_is_the_tuner_key_the_h200_logged(dcu, warm_probes):
    """What the background tuning reads from a `vllm serve` command line (govinda_patch/int8/
    launch_shape.py, vLLM's own parser and config with the overlay on) is the key the dense shape's
    H200 servers logged; arguments vLLM's parser refuses leave the tuning to the engine. The
    config.json shortcut for dense models agrees with vLLM, and leaves what it does not know to it."""
    from govinda_patch.int8 import launch_shape
    from govinda_patch.int8.tuner import TuneShape

    argv = ["/usr/local/bin/vllm", "serve", str(LLAMA8B), "--max-model-len", "32768", "--load-format", "dummy"]
    probed = launch_shape.predict(argv, 900, dcu)
    assert TuneShape(**probed).key() == logged_shape_key(LLAMA8B)
    refused = launch_shape.predict(argv + ["--no-such-flag"], 900, dcu)
    assert refused == {"skip": "vLLM's serve parser refused the arguments (exit 2)"}

    # The shortcut from config.json alone gives what vLLM gives, also where the flags change it.
    assert launch_shape.config_shape(argv) == probed
    changed = argv + ["--dtype", "float16", "--block-size=32", "--enforce-eager", "--port", "8000"]
    changed_probe = launch_shape.predict(changed, 900, dcu)
    assert (changed_probe["dtype"], changed_probe["block_size"]) == ("fp16", 32)
    assert launch_shape.config_shape(changed) == changed_probe
    # Whatever it does not know goes to vLLM's probe.
    assert launch_shape.config_shape(argv + ["--no-such-flag"]) is None
    assert launch_shape.config_shape(argv + ["--kv-cache-dtype", "fp8"]) is None
    assert launch_shape.config_shape(["vllm", "serve", "meta-llama/Llama-3.1-8B"]) is None
    assert launch_shape.config_shape(["vllm", "serve", str(QWEN35)]) is None


def test_probes_inspect_the_model_class_in_their_own_process():
    """Both probes (capacity, launch shape) run vLLM's model-class inspection in their own process
    instead of a second vLLM interpreter, and put vLLM's runner back afterwards."""
    import os

    from vllm.model_executor.models import registry

    from govinda_patch.kv_capacity_probe import model_inspection_here

    original = registry._run_in_subprocess
    with model_inspection_here():
        assert registry._run_in_subprocess(os.getpid) == os.getpid()
    assert registry._run_in_subprocess is original
