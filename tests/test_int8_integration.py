"""The INT8 group against the real vLLM package on a simulated DCU (fake amdsmi, gfx90a).

Every check goes through vLLM's own code: the ROCm platform's priority/selection functions,
EngineArgs.create_engine_config (hybrid alignment), a real Attention layer's get_kv_cache_spec,
vLLM's KV-cache grouping (page unification), and real CommonAttentionMetadata for forward passes.
"""

from __future__ import annotations

import textwrap

import pytest

from overlay_testing import REPO, logged_shape_key

QWEN35 = REPO / "tests" / "models" / "qwen3_5-27b-shape"
BACKEND_PATH = "govinda_patch.int8.backend.GovindaInt8AttentionBackend"
QWEN35_SHAPE = REPO / "tests" / "models" / "qwen3_5-27b-shape"

ENGINE_CONFIG = f"""
from vllm.engine.arg_utils import EngineArgs
cfg = EngineArgs(model={str(QWEN35)!r}, max_model_len=32768, load_format="dummy",
                 language_model_only=True, skip_tokenizer_init=True).create_engine_config()
"""


def test_rocm_priorities_follow_the_switches(child, dcu_env):
    code = """
    from vllm.platforms import current_platform  # resolve the platform first, as vLLM does
    import vllm.platforms.rocm as rocm
    from govinda_patch.patching import is_govinda_wrapper
    report({
        "plain": [b.name for b in rocm._get_backend_priorities(False, False)],
        "mla": [b.name for b in rocm._get_backend_priorities(True, False)],
        "wrapped": is_govinda_wrapper(rocm._get_backend_priorities),
    })
    """
    on = child(code, dcu_env)
    off = child(code, dict(dcu_env, GOVINDA_INT8_KV="0"))
    assert on.returncode == 0 and off.returncode == 0, (on, off)
    assert off.result["wrapped"] is False and "CUSTOM" not in off.result["plain"]
    assert on.result["wrapped"] is True
    assert on.result["plain"] == ["CUSTOM"] + off.result["plain"]
    assert on.result["mla"] == off.result["mla"] and "CUSTOM" not in on.result["mla"]


def test_selection_resolves_to_our_backend_class(child, dcu_env):
    code = """
    import torch
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.selector import AttentionSelectorConfig

    def select(head_size):
        config = AttentionSelectorConfig(head_size=head_size, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16)
        return current_platform.get_attn_backend_cls(None, config)

    ours = resolve_obj_by_qualname(select(256))
    from govinda_patch.int8.backend import GovindaInt8AttentionBackend
    report({"platform": type(current_platform).__name__, "d256": select(256), "d96": select(96),
            "is_class": ours is GovindaInt8AttentionBackend})
    """
    result = child(code, dcu_env)
    assert result.returncode == 0, result
    assert result.result["platform"] == "RocmPlatform"
    assert result.result["d256"] == BACKEND_PATH and result.result["is_class"] is True
    off = child(code, dict(dcu_env, GOVINDA_DISABLE="1"))
    assert off.returncode == 0, off
    assert off.result["d256"] != BACKEND_PATH
    # Head size 96 is not served by our kernels: vLLM's validation falls back to the stock choice.
    assert result.result["d96"] == off.result["d96"] != BACKEND_PATH


def test_qwen35_alignment_spec_and_unification(child, dcu_env):
    code = ENGINE_CONFIG + textwrap.dedent("""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.models import ModelRegistry
    try:
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups  # vLLM >= 0.33
    except ImportError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from vllm.utils.torch_utils import set_default_torch_dtype

    cache = cfg.cache_config
    # Model construction runs under the model dtype (bf16), as in vLLM's model loader.
    from vllm.platforms import current_platform

    with set_current_vllm_config(cfg), set_default_torch_dtype(cfg.model_config.dtype):
        layer = Attention(24, 256, 256 ** -0.5, num_kv_heads=4, cache_config=cache, prefix="model.layers.3.self_attn.attn")
        # What the worker does after loading the model (the hybrid alignment of vLLM 0.26 lives here).
        current_platform.update_block_size_for_backend(cfg)
        spec = layer.get_kv_cache_spec(cfg)
    model_cls, _ = ModelRegistry.resolve_model_cls(cfg.model_config.architecture, model_config=cfg.model_config)
    mamba = MambaSpec(shapes=model_cls.get_mamba_state_shape_from_config(cfg),
                      dtypes=model_cls.get_mamba_state_dtype_from_config(cfg),
                      block_size=cache.mamba_block_size or cfg.model_config.max_model_len,
                      page_size_padded=cache.mamba_page_size_padded)
    layers = {f"model.layers.{i}.self_attn.attn": spec for i in range(3, 64, 4)}
    layers.update({f"model.layers.{i}.linear_attn": mamba for i in range(64) if i % 4 != 3})
    try:
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    except ImportError:  # vLLM < 0.33: the runner shapes the cache with the backend's get_kv_cache_shape
        layout = None
    else:  # vLLM >= 0.33: the engine core resolves one layout the backends support (GDN's: any)
        names = [l.name for l in get_supported_kv_cache_layouts([layer.get_attn_backend()])]
        layout = resolve_kv_cache_layout(cfg, [names], layers.values()).name
    groups = get_kv_cache_groups(cfg, layers)
    attention_groups = [g.kv_cache_spec for g in groups if isinstance(g.kv_cache_spec, FullAttentionSpec)]
    report({
        "impl": type(layer.impl).__name__,
        "spec_type": type(spec).__name__, "spec_dtype": str(spec.dtype), "spec_head": spec.head_size,
        "spec_block": spec.block_size, "spec_page": spec.page_size_bytes,
        "mamba_page_padded": cache.mamba_page_size_padded, "mamba_page_unpadded": mamba.real_page_size_bytes if hasattr(mamba, "real_page_size_bytes") else None,
        "unified_blocks": sorted({s.block_size for s in attention_groups}),
        "unified_pages": sorted({g.kv_cache_spec.page_size_bytes for g in groups}),
        "num_groups": len(groups), "layout": layout,
    })
    """)
    result = child(code, dcu_env)
    assert result.returncode == 0, result
    r = result.result
    heads, head_dim = 4, 256
    int8_token_bytes = 2 * heads * (head_dim + 4)
    assert r["impl"] == "GovindaInt8AttentionImpl"
    assert r["spec_type"] == "FullAttentionSpec" and r["spec_dtype"] == "torch.int8" and r["spec_head"] == head_dim + 4
    assert r["spec_page"] == r["spec_block"] * int8_token_bytes
    # vLLM pads the mamba page to a whole number of INT8 blocks, then unifies every page to it.
    assert r["mamba_page_padded"] % int8_token_bytes == 0
    assert r["mamba_page_padded"] % r["spec_page"] == 0
    (block,) = r["unified_blocks"]
    assert block % 16 == 0 and block * int8_token_bytes == r["mamba_page_padded"]
    assert r["unified_pages"] == [r["mamba_page_padded"]]
    # vLLM >= 0.33: a block-compact layout (each page one contiguous run, as our kernels read it).
    assert r["layout"] in (None, "LBHNC", "LBNHC", "BLHNC", "BLNHC")
    print("INT8 hybrid block size:", block)

    stock = child(code, dict(dcu_env, GOVINDA_DISABLE="1"))
    assert stock.returncode == 0, stock
    bf16_token_bytes = 2 * heads * head_dim * 2
    (stock_block,) = stock.result["unified_blocks"]
    assert stock.result["spec_dtype"] == "torch.bfloat16" and stock_block * bf16_token_bytes == stock.result["mamba_page_padded"]
    # Same mamba state, INT8 pages hold ~1.97x the tokens per byte.
    assert block > stock_block


def test_raw_cache_views_into_backend_shape_and_builder_checks_pages(child, dcu_env):
    code = ENGINE_CONFIG + textwrap.dedent("""
    import torch
    from govinda_patch.int8.backend import GovindaInt8AttentionBackend, GovindaInt8MetadataBuilder
    from govinda_patch.kernel_package import import_kernel
    from govinda_patch.int8.kv_spec import int8_spec_for
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    layout = import_kernel("int8_kv_layout")
    block = 1552  # the hybrid block size vLLM derives for Qwen3.5-27B with INT8 pages
    spec = int8_spec_for(FullAttentionSpec(block_size=block, num_kv_heads=4, head_size=256, dtype=torch.bfloat16))
    cfg.cache_config.mamba_page_size_padded = spec.page_size_bytes  # as the alignment leaves it
    num_blocks = 3
    raw = torch.zeros(num_blocks * spec.page_size_bytes, dtype=torch.int8)
    shape = GovindaInt8AttentionBackend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
    cache = raw.view(spec.dtype).view(shape)   # what vLLM's runner does with the raw tensor
    views = layout.split_cache(cache, spec.block_size, 4, 256)
    views.v_scale[2, 3, block - 1] = 1.5
    last_four = raw[(num_blocks * spec.page_size_bytes) - 4:].view(torch.float32).item()
    good = GovindaInt8MetadataBuilder(spec, ["l3"], cfg, torch.device("cpu"))
    try:
        GovindaInt8MetadataBuilder(int8_spec_for(FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=256, dtype=torch.bfloat16)), ["l3"], cfg, torch.device("cpu"))
        mismatch = None
    except RuntimeError as exc:
        mismatch = str(exc)
    report({"shape": list(shape), "page": spec.page_size_bytes, "last_scale": last_four,
            "workspace": type(good.workspace).__name__, "mismatch": mismatch})
    """)
    result = child(code, dcu_env)
    assert result.returncode == 0, result
    r = result.result
    assert r["shape"] == [3, r["page"]]
    assert r["last_scale"] == 1.5  # block b ends exactly at (b+1)*page: the last V scale is the page's last bytes
    assert r["mismatch"] and "disagree" in r["mismatch"]


MIXED_BATCH = """
import dataclasses, json, os, tempfile
import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec

model_dir = tempfile.mkdtemp()
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 4096,
           "torch_dtype": "float16", "rms_norm_eps": 1e-5}, open(os.path.join(model_dir, "config.json"), "w"))
cfg = EngineArgs(model=model_dir, max_model_len=1024, load_format="dummy", skip_tokenizer_init=True,
                 dtype="float16").create_engine_config()

from govinda_patch.int8.backend import GovindaInt8AttentionImpl, GovindaInt8MetadataBuilder
from govinda_patch.kernel_package import import_kernel
from govinda_patch.int8.kv_spec import int8_spec_for

layout = import_kernel("int8_kv_layout")
attention = import_kernel("int8_paged_attention")
torch.manual_seed(0)
heads, kv_heads, head_dim, block = 4, 2, 64, 32
spec = int8_spec_for(FullAttentionSpec(block_size=block, num_kv_heads=kv_heads, head_size=head_dim, dtype=torch.float16))
builder = GovindaInt8MetadataBuilder(spec, ["layer"], cfg, torch.device("cpu"))
impl = GovindaInt8AttentionImpl(heads, head_dim, head_dim ** -0.5, kv_heads, None, None, "auto")

# Two decodes (contexts 40 and 70) then a 9-token prefill chunk over a 30-token INT8 prefix.
query_lens, seq_lens = [1, 1, 9], [40, 70, 39]
num_blocks = 12
cache = torch.zeros(layout.cache_shape(num_blocks, block, kv_heads, head_dim), dtype=torch.int8)
tables = [[1, 2, 0], [3, 4, 5], [6, 7, 0]]
def slot(seq, pos):
    return tables[seq][pos // block] * block + pos % block
k_all = [torch.randn(s, kv_heads, head_dim, dtype=torch.float16) for s in seq_lens]
v_all = [torch.randn(s, kv_heads, head_dim, dtype=torch.float16) for s in seq_lens]
# Earlier steps: the context before this step's tokens, through our real KV update.
for seq, (q_len, s_len) in enumerate(zip(query_lens, seq_lens)):
    prefix = s_len - q_len
    slots = torch.tensor([slot(seq, p) for p in range(prefix)], dtype=torch.int64)
    impl.do_kv_cache_update(None, k_all[seq][:prefix], v_all[seq][:prefix], cache, slots)
# This step: new tokens, laid out like vLLM's fused qkv (non-contiguous key/value views).
new_k = torch.cat([k_all[s][seq_lens[s] - q:] for s, q in enumerate(query_lens)])
new_v = torch.cat([v_all[s][seq_lens[s] - q:] for s, q in enumerate(query_lens)])
num_tokens = sum(query_lens)
qkv = torch.randn(num_tokens + 3, (heads + 2 * kv_heads) * head_dim, dtype=torch.float16)  # 3 padded rows
qkv[:num_tokens, heads * head_dim:(heads + kv_heads) * head_dim] = new_k.reshape(num_tokens, -1)
qkv[:num_tokens, (heads + kv_heads) * head_dim:] = new_v.reshape(num_tokens, -1)
query = qkv[:, :heads * head_dim].view(-1, heads, head_dim)
key = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(-1, kv_heads, head_dim)
value = qkv[:, (heads + kv_heads) * head_dim:].view(-1, kv_heads, head_dim)
slot_mapping = torch.tensor([slot(s, seq_lens[s] - q + i) for s, q in enumerate(query_lens) for i in range(q)] + [-1, -1, -1])

query_start_loc = torch.tensor([0, 1, 2, 11], dtype=torch.int32)
# CPU copies that vLLM < 0.33 carries in the metadata (0.33 dropped these fields).
cpu_mirrors = {"_seq_lens_cpu": torch.tensor(seq_lens, dtype=torch.int32),
               "_num_computed_tokens_cpu": torch.tensor([s - q for s, q in zip(seq_lens, query_lens)], dtype=torch.int32),
               "seq_lens_cpu_upper_bound": torch.tensor(seq_lens, dtype=torch.int32)}
cpu_mirrors = {k: v for k, v in cpu_mirrors.items() if k in {f.name for f in dataclasses.fields(CommonAttentionMetadata)}}
common = CommonAttentionMetadata(
    query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc.clone(),
    seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=3, num_actual_tokens=num_tokens,
    max_query_len=9, max_seq_len=70, block_table_tensor=torch.tensor(tables, dtype=torch.int32),
    slot_mapping=slot_mapping, causal=True, **cpu_mirrors)
metadata = builder.build(0, common)
before = cache.clone()
impl.do_kv_cache_update(None, key, value, cache, slot_mapping)
output = torch.full((num_tokens + 3, heads, head_dim), 7.0, dtype=torch.float16)
impl.forward(None, query, key, value, cache, metadata, output=output)

expected = attention.attention_reference(query[:num_tokens], cache, common.query_start_loc, common.seq_lens,
    common.block_table_tensor, block_size=block, num_kv_heads=kv_heads, softmax_scale=head_dim ** -0.5,
    rotation=impl.kv_rotation)
# fp32 attention on the ORIGINAL fp16 K/V, for the quantization error.
exact = []
for seq, (q_len, s_len) in enumerate(zip(query_lens, seq_lens)):
    start = int(query_start_loc[seq])
    q = query[start:start + q_len].float().transpose(0, 1)
    k = k_all[seq].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
    v = v_all[seq].float().repeat_interleave(heads // kv_heads, 1).transpose(0, 1)
    positions = torch.arange(s_len - q_len, s_len)[:, None]
    mask = torch.arange(s_len)[None, :] <= positions
    scores = (q @ k.transpose(1, 2)) * head_dim ** -0.5
    exact.append((scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v).transpose(0, 1))
exact = torch.cat(exact)
# The FA3 prefill path with the torch varlen reference in FA3's place (no FA3 on a CPU): the
# builder sizes it from the metadata's CPU copies; the same cache must give the same attention.
from govinda_patch.int8 import prefill_kernel
gather = import_kernel("int8_kv_gather")
assert builder.prefill.name == "triton" and metadata.gathered_prefill is None
builder.prefill = prefill_kernel.PrefillChoice("fa3", gather.varlen_attention_reference, "test")
gathered_metadata = builder.build(0, common)
plan = gathered_metadata.gathered_prefill
gathered_output = torch.full_like(output, 7.0)
impl.forward(None, query, key, value, cache, gathered_metadata, output=gathered_output)
reference_cache = torch.zeros_like(cache)
for seq, (q_len, s_len) in enumerate(zip(query_lens, seq_lens)):
    slots = torch.tensor([slot(seq, p) for p in range(s_len)], dtype=torch.int64)
    layout.store_reference(k_all[seq], v_all[seq], reference_cache, slots, block, rotation=impl.kv_rotation)
report({
    "kv_rotation": impl.kv_rotation,
    "num_decodes": metadata.num_decodes,
    "kernel_vs_reference": float((output[:num_tokens].float() - expected).abs().max()),
    "int8_vs_exact": float((output[:num_tokens].float() - exact).abs().max()),
    "padding_untouched": bool((output[num_tokens:] == 7.0).all()),
    "padded_slots_untouched": bool(torch.equal(cache[0], before[0])),
    "store_matches_reference": bool(torch.equal(cache, reference_cache)),
    "gathered_plan": None if plan is None else [plan.total_k, plan.max_seqlen_k, plan.max_seqlen_q,
                                               plan.num_prefill_tokens, plan.cu_seqlens_k.tolist(), plan.cu_seqlens_q.tolist()],
    "gathered_vs_reference": float((gathered_output[:num_tokens].float() - expected).abs().max()),
    "gathered_decodes_identical": bool(torch.equal(gathered_output[:2], output[:2])),
    "gathered_padding_untouched": bool((gathered_output[num_tokens:] == 7.0).all()),
})
"""


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_forward_and_kv_update_with_real_vllm_metadata(child, dcu_env, rotation):
    env = dict(dcu_env, TRITON_INTERPRET="1", GOVINDA_KV_ROTATION=rotation)
    result = child(MIXED_BATCH, env, timeout=900)
    assert result.returncode == 0, result
    r = result.result
    assert r["kv_rotation"] == rotation  # the switch reached the impl
    assert r["num_decodes"] == 2
    # fp16 output rounding of O(1) values (~1e-3) plus fp16 P/V in the dot products.
    assert r["kernel_vs_reference"] < 1e-2, r
    # INT8 K/V (absmax/127 per token-head) moves attention outputs by a few 1e-2 at most here.
    assert r["int8_vs_exact"] < 5e-2, r
    assert r["padding_untouched"] and r["padded_slots_untouched"]
    assert r["store_matches_reference"]
    # Gather + varlen prefill: host sizes from the CPU copies (one 9-token chunk over 39 positions).
    assert r["gathered_plan"] == [39, 39, 9, 9, [0, 39], [0, 9]], r
    assert r["gathered_vs_reference"] < 1e-2, r
    assert r["gathered_decodes_identical"] and r["gathered_padding_untouched"]


def test_kill_and_revert_restore_every_original_object(child, dcu_env):
    code = """
    import importlib
    from vllm.platforms import current_platform
    import vllm.platforms.rocm, vllm.model_executor.models.config, vllm.model_executor.layers.attention.attention
    from govinda_patch import bootstrap
    from govinda_patch.patching import is_govinda_wrapper, original_of, raw_attribute, resolve_owner
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    overlay = bootstrap.OVERLAY
    wrapped_priorities = [b.name for b in vllm.platforms.rocm._get_backend_priorities(False, False)]
    targets = [(t, *resolve_owner(importlib.import_module(t.module), t.attribute))
               for e in overlay.entries.values() for t in e.active_targets]
    before = {t.label: raw_attribute(owner, name) for t, owner, name in targets}
    wrapped = sorted(label for label, obj in before.items() if is_govinda_wrapper(obj))
    originals = {label: original_of(obj) for label, obj in before.items()}
    overlay.revert_all()
    after = {t.label: raw_attribute(owner, name) for t, owner, name in targets}
    report({"wrapped": wrapped,
            "restored": sorted(l for l in after if after[l] is originals[l]),
            "custom_overridden": AttentionBackendEnum.CUSTOM.is_overridden(),
            "wrapped_priorities": wrapped_priorities,
            "priorities": [b.name for b in vllm.platforms.rocm._get_backend_priorities(False, False)]})
    """
    result = child(code, dcu_env)
    assert result.returncode == 0, result
    r = result.result
    assert len(r["wrapped"]) == 4  # every wrapper target (the registration is not a wrapper)
    assert set(r["restored"]) >= set(r["wrapped"])
    assert r["custom_overridden"] is False
    assert r["wrapped_priorities"] == ["CUSTOM"] + r["priorities"]


def test_failed_kernel_selftest_reverts_the_group(child, dcu_env):
    code = """
    from vllm.platforms import current_platform  # resolve the platform first, as vLLM does
    import vllm.platforms.rocm as rocm
    first = [b.name for b in rocm._get_backend_priorities(False, False)]
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    report({"priorities": first, "custom": AttentionBackendEnum.CUSTOM.is_overridden()})
    """
    # No GPU and no interpreter: the self-test cannot run our kernels, so the group must not act.
    env = dict(dcu_env, GOVINDA_SELFTEST="auto")
    env.pop("TRITON_INTERPRET", None)
    result = child(code, env)
    assert result.returncode == 0, result
    assert "CUSTOM" not in result.result["priorities"] and result.result["custom"] is False
    errors = [l for l in result.govinda_lines() if " ERROR " in l]
    assert len(errors) == 1 and "kernel self-test failed" in errors[0] and "no GPU" in errors[0], result.govinda_lines()
    strict = child(code, dict(env, GOVINDA_STRICT="1"))
    assert strict.returncode != 0 and "kernel self-test failed" in strict.stderr


def test_selftest_passes_with_the_triton_interpreter(child, dcu_env):
    code = """
    from vllm.platforms import current_platform  # resolve the platform first, as vLLM does
    import vllm.platforms.rocm as rocm
    report([b.name for b in rocm._get_backend_priorities(False, False)])
    """
    env = dict(dcu_env, GOVINDA_SELFTEST="auto", TRITON_INTERPRET="1")
    # The guard's self-test child (``sys.executable -m govinda_patch selftest``) forks from the warm
    # interpreter too: it skips importing torch again.
    result = child(code, env, timeout=900, warm_executable=True)
    assert result.returncode == 0, result
    assert result.result[0] == "CUSTOM"
    assert any("kernel self-test passed" in l for l in result.govinda_lines()), result.govinda_lines()


def test_a_server_launch_tests_the_kernels_in_the_background_before_the_worker_starts(child, dcu_env, cache_dir):
    """GOVINDA_SELFTEST=auto in a `vllm serve` process: the self-test starts when vLLM is imported,
    the worker module's import waits for it, and the guard then reads its verdict (no child of its own)."""
    code = f"""
    import sys, time
    # What the overlay sees in a server's API process.
    sys.argv = ["/usr/local/bin/vllm", "serve", {str(QWEN35_SHAPE)!r}, "--max-model-len", "32768"]
    begin = time.monotonic()
    import vllm
    imported = time.monotonic() - begin
    import vllm.v1.worker.gpu_worker  # the engine's worker: waits for the background self-test
    waited = time.monotonic() - begin - imported
    from govinda_patch.int8 import child as child_runner

    def no_child(*args, **kwargs):
        raise AssertionError("the guard ran a self-test child although the background one cached its verdict")

    child_runner.run_subcommand = no_child
    from vllm.platforms import current_platform
    import vllm.platforms.rocm as rocm
    report({{"first": rocm._get_backend_priorities(False, False)[0].name, "imported": imported, "waited": waited}})
    """
    env = dict(dcu_env, GOVINDA_SELFTEST="auto", TRITON_INTERPRET="1")
    # The background self-test (``sys.executable -m govinda_patch selftest --prefetch``) is forked
    # from the warm interpreter too: it holds its lock through the launcher, which outlives it.
    first = child(code, env, timeout=900, warm_executable=True)
    assert first.returncode == 0, first
    lines = first.govinda_lines()
    assert any("kernel self-test and the launch-config tuning started in the background" in l for l in lines), lines
    assert first.result["first"] == "CUSTOM", lines
    assert any("kernel self-test passed" in l for l in lines), lines
    assert "(background) passed" in first.stderr, first.stderr[-2000:]
    # The same process then tuned the shape vLLM configures from the launch's arguments (the
    # builder's key, as the H200 logged it for this model); on the CPU the tuner keeps its hand table.
    tuned = [l for l in first.stderr.splitlines() if "launch configs in the background" in l]
    assert len(tuned) == 1 and f"{logged_shape_key(QWEN35_SHAPE)}: hand table" in tuned[0], first.stderr[-3000:]
    assert first.result["waited"] > 0 and "s for the background self-test and tuning" in first.stderr
    selftest_dir = cache_dir / "selftest"
    assert len(list(selftest_dir.glob("default-*.json"))) == 1
    # Warm: the alias shows the verdict is cached, so nothing starts and nothing is waited for.
    second = child(code, env, timeout=900, warm_executable=True)
    assert second.returncode == 0, second
    assert not any("started in the background" in l for l in second.govinda_lines()), second.govinda_lines()
    assert second.result["first"] == "CUSTOM" and "(background)" not in second.stderr
