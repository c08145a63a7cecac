"""The dense D=128 H200 A/B (issue #15): its sides file against the committed server logs, the
model directory scripts/h200/assemble_model.sh builds, and the model ab_bench_serve.sh passes on
(CPU, no vLLM: a stand-in python3 records what would reach bench/ab.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from bench import ab, ab_side, serve_tiers

REPO_ROOT = Path(__file__).resolve().parent.parent
H200 = REPO_ROOT / "scripts" / "h200"
LOGS = REPO_ROOT / "reports" / "h200"
# The same synthetic tokenizer the device bundle carries as .device/models/qwen3_5-27b-shape.
TOKENIZER_DIR = REPO_ROOT / "tests" / "models" / "qwen3_5-27b-shape"


def test_dense128_sides_file_and_its_logs():
    config = ab.parse_config(["--sides", str(H200 / "ab_dense128_bench_serve.yaml")])
    assert config.workload() == "tiers" and config.baseline_name() == "fa3_bf16"
    assert [s.name for s in config.sides] == ["govinda", "fa3_bf16"]
    assert config.model == "/tmp/llama8b-shape"
    assert config.bench["input_lens"] == [6144, 24576] and config.bench["output_len"] == 256
    assert serve_tiers.BenchConfig(tokenizer=config.model, **config.bench).max_concurrency == 1
    # Qwen3.5-only flags stay out: no GDN layers, no multimodal wrapper.
    assert not any("gdn" in str(a) or a == "--language-model-only" for a in config.server_args)
    assert [s.env for s in config.sides] == [{"GOVINDA_DISABLE": "0"}, {"GOVINDA_DISABLE": "1"}]
    govinda, fa3 = config.sides
    counts = ab_side.count_log_patterns(LOGS / "dense128_bench_serve_govinda.log", govinda.log_patterns)
    assert all(c["ok"] for c in counts.values()), counts
    counts = ab_side.count_log_patterns(LOGS / "dense128_bench_serve_fa3_bf16.log", fa3.log_patterns)
    assert all(c["ok"] for c in counts.values()), counts
    # Each side's backend pattern must fail on the other side's log.
    other = ab_side.count_log_patterns(LOGS / "dense128_bench_serve_govinda.log", fa3.log_patterns)
    assert other["attention_backend"]["count"] == 0
    other = ab_side.count_log_patterns(LOGS / "dense128_bench_serve_fa3_bf16.log", govinda.log_patterns)
    assert not other["prefill_kernel_fa3"]["ok"] and not other["attention_backend"]["ok"]


def test_assembled_llama8b_shape_loads(tmp_path):
    dest = tmp_path / "llama8b-shape"
    out = subprocess.run(["sh", str(H200 / "assemble_model.sh"), "llama8b-shape", str(TOKENIZER_DIR), str(dest)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(dest)
    config = AutoConfig.from_pretrained(dest)
    assert config.architectures == ["LlamaForCausalLM"]
    shape = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
             config.num_key_value_heads, config.head_dim, config.intermediate_size)
    assert shape == (4096, 32, 32, 8, 128, 14336)  # Llama-3-8B
    assert config.rope_parameters["rope_theta"] == 500000 and config.rms_norm_eps == 1e-5
    assert str(config.dtype) == "torch.bfloat16"
    assert config.max_position_embeddings >= 24576 + 256
    tokenizer = AutoTokenizer.from_pretrained(dest)
    assert len(tokenizer) == config.vocab_size
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.eos_token_id == config.eos_token_id == config.bos_token_id == endoftext
    # A rerun over an existing directory (its copied files read-only, as in the bundle) succeeds.
    for path in dest.iterdir():
        path.chmod(0o444)
    again = subprocess.run(["sh", str(H200 / "assemble_model.sh"), "llama8b-shape", str(TOKENIZER_DIR), str(dest)],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert again.returncode == 0, again.stderr


def _sandbox(tmp_path: Path, with_bundle: bool = True) -> tuple[Path, dict]:
    """A .dev/c copy of the checkout (the layout of a device call) whose env.sh puts a python3
    first on PATH that prints bench/ab.py's arguments instead of running it."""
    root = tmp_path / "root"
    checkout = root / ".dev" / "c"
    (checkout / "scripts" / "h200" / "models").mkdir(parents=True)
    (checkout / "bench").symlink_to(REPO_ROOT / "bench")
    for name in ("ab_bench_serve.sh", "carried.sh", "assemble_model.sh", "ab_qwen35_64layer_bench_serve.yaml"):
        (checkout / "scripts" / "h200" / name).symlink_to(H200 / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (checkout / "scripts" / "h200" / "env.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    fake = bin_dir / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1 $2" in\n'
        '  "-m bench.ab") shift 2; echo "$*"; exit 0 ;;\n'
        '  "-m vllm.entrypoints.cli.main") exit 0 ;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    fake.chmod(0o755)
    if with_bundle:
        bundle = root / ".device" / "models"
        bundle.mkdir(parents=True)
        (bundle / "qwen3_5-27b-shape").symlink_to(TOKENIZER_DIR)
    env = dict(os.environ, OUT=str(tmp_path / "out"))
    return checkout, env


def _bench_serve(checkout: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "scripts/h200/ab_bench_serve.sh", *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=60)


def test_ab_bench_serve_takes_the_sides_files_model(tmp_path):
    checkout, env = _sandbox(tmp_path)
    out = tmp_path / "out"
    # The default file: the carried Qwen shape two levels up, the command line as before.
    run = _bench_serve(checkout, env, "fa3_bf16", "--", "--input-lens", "8192")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        "--sides", "scripts/h200/ab_qwen35_64layer_bench_serve.yaml", "--model", "../../.device/models/qwen3_5-27b-shape",
        "--only", "fa3_bf16", "--stop-grace", "10", "--report-dir", str(out), "--log-dir", str(out),
        "--input-lens", "8192"]
    # /tmp/NAME with a committed config: assembled there with the carried tokenizer first.
    name = f"govinda-test-{uuid.uuid4().hex[:8]}"
    (checkout / "scripts" / "h200" / "models" / name).mkdir()
    shutil.copy(H200 / "models" / "llama8b-shape" / "config.json", checkout / "scripts" / "h200" / "models" / name)
    (checkout / "dense.yaml").write_text(f"model: /tmp/{name}\nsides: [{{name: a}}, {{name: b}}]\n")
    try:
        run = _bench_serve(checkout, env, "--sides", "dense.yaml", "a", "b")
        assert run.returncode == 0, run.stderr
        assert run.stdout.split()[:6] == ["--sides", "dense.yaml", "--model", f"/tmp/{name}", "--only", "a"]
        assembled = sorted(p.name for p in Path(f"/tmp/{name}").iterdir())
        assert assembled == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    finally:
        shutil.rmtree(f"/tmp/{name}", ignore_errors=True)


def test_ab_bench_serve_without_the_bundle_says_so(tmp_path):
    checkout, env = _sandbox(tmp_path, with_bundle=False)
    run = _bench_serve(checkout, env, "fa3_bf16")
    assert run.returncode == 1 and run.stdout == ""
    assert "no .device/models/qwen3_5-27b-shape here or in ../.." in run.stderr
