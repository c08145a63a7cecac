"""Where test_gguf_to_hf keeps the directory scripts/h200/gguf_to_hf.py wrote, so the ~1 min
conversion runs once per input, not once per run.

The key is everything the output depends on: the GGUF file's bytes, the script's source, and the
versions of Python, torch, transformers and gguf that did the dequantization and saving. Any
change gives a new key and a new conversion; the tests check the kept directory as they would a new
one. It lives outside the checkout, under the model cache (GOVINDA_MODEL_CACHE).
"""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path

from bench.accuracy import model_source


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def converted_dir(gguf_file: Path, script: Path) -> Path:
    versions = [f"python={sys.version_info[0]}.{sys.version_info[1]}"]
    versions += [f"{name}={metadata.version(name)}" for name in ("torch", "transformers", "gguf")]
    key = hashlib.sha256("\n".join([_sha256(gguf_file), _sha256(script), *versions]).encode()).hexdigest()[:24]
    return model_source.cache_dir() / "gguf-to-hf" / key / "smollm2-hf"
