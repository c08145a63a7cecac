"""Child code shared by the cases that build one rank's KV-cache layers as vLLM does.

``RANK_LAYERS`` is Python source for a ``run_child`` snippet: it defines ``models`` (the hybrid
Qwen3.5 shape and a dense Llama-3-8B shape) and ``rank_layers(name, **engine_args)``, which builds
vLLM's engine config for that model (dummy weights, no tokenizer), one attention layer from it
(heads from its ParallelConfig), the layer's KV-cache spec after the worker-side block-size
alignment, the 64-layer table of the model (mamba specs for Qwen3.5's linear-attention layers) and
vLLM's own page unification (``get_kv_cache_groups``).
"""

from __future__ import annotations

from overlay_testing import REPO

QWEN35 = REPO / "tests" / "models" / "qwen3_5-27b-shape"
# Llama-3-8B attention shape (dense, 8 KV heads); two layers are enough for the configuration.
DENSE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
         "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "num_hidden_layers": 2, "vocab_size": 128256, "max_position_embeddings": 8192,
         "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}

RANK_LAYERS = f"""
import json, os, tempfile
from vllm.config import set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.attention.attention import Attention
from vllm.model_executor.models import ModelRegistry
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_default_torch_dtype
from vllm.v1.kv_cache_interface import MambaSpec
try:
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups  # vLLM >= 0.33
except ImportError:
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

dense_dir = tempfile.mkdtemp()
json.dump({DENSE!r}, open(os.path.join(dense_dir, "config.json"), "w"))
models = {{"qwen35": dict(model={str(QWEN35)!r}, max_model_len=32768, language_model_only=True),
          "dense": dict(model=dense_dir, max_model_len=8192)}}

def rank_layers(name, **engine_args):
    cfg = EngineArgs(load_format="dummy", skip_tokenizer_init=True, **models[name], **engine_args).create_engine_config()
    mc, pc, cache = cfg.model_config, cfg.parallel_config, cfg.cache_config
    # As the model does on a rank: heads divided by vLLM's parallel config, built under its dtype.
    with set_current_vllm_config(cfg), set_default_torch_dtype(mc.dtype):
        layer = Attention(mc.get_num_attention_heads(pc), mc.get_head_size(), mc.get_head_size() ** -0.5,
                          num_kv_heads=mc.get_num_kv_heads(pc), cache_config=cache,
                          prefix="model.layers.3.self_attn.attn")
        current_platform.update_block_size_for_backend(cfg)  # the worker-side alignment (vLLM >= 0.26)
        spec = layer.get_kv_cache_spec(cfg)
    layers = {{f"model.layers.{{i}}.self_attn.attn": spec for i in range(3, 64, 4)}}
    if name == "qwen35":
        model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
        mamba = MambaSpec(shapes=model_cls.get_mamba_state_shape_from_config(cfg),
                          dtypes=model_cls.get_mamba_state_dtype_from_config(cfg),
                          block_size=cache.mamba_block_size or mc.max_model_len,
                          page_size_padded=cache.mamba_page_size_padded)
        layers.update({{f"model.layers.{{i}}.linear_attn": mamba for i in range(64) if i % 4 != 3}})
    try:
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    except ImportError:
        pass  # vLLM < 0.33: the runner shapes the cache with the backend's get_kv_cache_shape
    else:  # vLLM >= 0.33: the engine core resolves one layout (recorded on the cache config)
        names = [l.name for l in get_supported_kv_cache_layouts([layer.get_attn_backend()])]
        resolve_kv_cache_layout(cfg, [names], layers.values())
    groups = get_kv_cache_groups(cfg, layers)  # raises on pages that cannot be unified
    return cfg, layer, spec, layers, groups
"""
