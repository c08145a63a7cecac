"""One KV-capacity computation through the installed vLLM's own code, in this process.

``python -m govinda_patch capacity`` runs this module in two fresh interpreters, one with the
overlay off (``GOVINDA_DISABLE=1``) and one with it on, and reads the JSON line each prints. Inside,
every number comes from vLLM as it configures a server, with whatever the overlay patched:

1. ``EngineArgs(...).create_engine_config()`` for the model directory (config only, no weights;
   vLLM 0.18 aligns the hybrid attention/mamba page here);
2. one real ``Attention`` layer with the model's heads, built under that config (backend selection
   by the platform), then ``update_block_size_for_backend`` as the worker calls it (the hybrid
   alignment of vLLM 0.26 and later), then that layer's ``get_kv_cache_spec``;
3. a ``MambaSpec`` per linear-attention layer through vLLM's own ``MambaBase.get_kv_cache_spec``
   (the state shapes and dtypes from the model class, as vLLM's alignment computes them);
4. ``get_kv_cache_configs`` with the KV memory: page unification, grouping, the block count, and
   vLLM's own "GPU KV cache size" / "Maximum concurrency" numbers.

No GPU is used and no weights are read; vLLM still needs its platform (ROCm on a DCU, CUDA on
NVIDIA, the simulated DCU of ``tests/dcu_sim`` in tests).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from .model_weights import UnsupportedModel, parameter_count

GIB = 1 << 30
LAYOUT_PROBE_BYTES = 1 << 40  # 1 TiB
RESULT_MARK = "govinda-capacity-result: "


class CapacityError(RuntimeError):
    """The model or the request is outside what this calculation covers."""


@contextlib.contextmanager
def model_inspection_here():
    """vLLM inspects a model class (hybrid or not, multimodal or not, ...) in a new interpreter
    (``registry._run_in_subprocess``) so that its own process never initialises CUDA: a second
    import of vLLM, on a cold start about as long as the first. A probe process runs no GPU work,
    starts nothing after it and ends after one answer, so the inspection runs in it. vLLM's
    model-info cache is written as before."""
    from vllm.model_executor.models import registry

    original = getattr(registry, "_run_in_subprocess", None)
    if original is None:
        yield
        return
    registry._run_in_subprocess = lambda fn: fn()
    try:
        yield
    finally:
        registry._run_in_subprocess = original


def _engine_config(request: Dict[str, Any]):
    from vllm.engine.arg_utils import EngineArgs

    kwargs = dict(model=request["model"], max_model_len=request["max_model_len"], load_format="dummy",
                  skip_tokenizer_init=True, gpu_memory_utilization=request["gpu_memory_utilization"],
                  language_model_only=request["language_model_only"])
    if request.get("kv_cache_dtype"):
        kwargs["kv_cache_dtype"] = request["kv_cache_dtype"]
    return EngineArgs(**kwargs).create_engine_config()


def _layer_names(model_config, parallel_config) -> tuple[List[str], List[str]]:
    """Names of the attention and the linear-attention (mamba) layers, by vLLM's own count."""
    total = model_config.get_num_layers(parallel_config)
    attention = model_config.get_num_layers_by_block_type(parallel_config, "attention")
    kinds = list(getattr(model_config.hf_text_config, "layer_types", None) or [])
    if len(kinds) != total or sum(k == "full_attention" for k in kinds) != attention:
        kinds = ["full_attention"] * attention + ["linear_attention"] * (total - attention)
    attn = [f"model.layers.{i}.self_attn.attn" for i, k in enumerate(kinds) if k == "full_attention"]
    mamba = [f"model.layers.{i}.linear_attn" for i, k in enumerate(kinds) if k != "full_attention"]
    return attn, mamba


def _check_supported(model_config) -> None:
    text = model_config.hf_text_config
    if getattr(model_config, "use_mla", False):
        raise CapacityError("MLA models are not covered (their KV spec is not a plain attention page)")
    kinds = set(getattr(text, "layer_types", None) or [])
    window = model_config.get_sliding_window() if hasattr(model_config, "get_sliding_window") else None
    if window or "sliding_attention" in kinds:  # vLLM's own reading (Qwen2 declares a window it does not use)
        raise CapacityError("models with sliding-window layers are not covered")
    if model_config.is_hybrid and not hasattr(model_config, "get_num_layers_by_block_type"):
        raise CapacityError("this vLLM cannot count the model's layers by type")


def _attention_spec(cfg):
    import torch  # noqa: F401  (vLLM's layers need it; imported before them as vLLM does)
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_config, parallel_config = cfg.model_config, cfg.parallel_config
    heads = model_config.get_num_attention_heads(parallel_config)
    kv_heads = model_config.get_num_kv_heads(parallel_config)
    head_size = model_config.get_head_size()
    with set_current_vllm_config(cfg), set_default_torch_dtype(model_config.dtype):
        layer = Attention(heads, head_size, head_size ** -0.5, num_kv_heads=kv_heads,
                          cache_config=cfg.cache_config, prefix="model.layers.0.self_attn.attn")
        current_platform.update_block_size_for_backend(cfg)
        spec = layer.get_kv_cache_spec(cfg)
    return layer, spec


def _mamba_spec(cfg):
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.model_executor.models import ModelRegistry

    model_cls, _ = ModelRegistry.resolve_model_cls(cfg.model_config.architecture, model_config=cfg.model_config)
    # vLLM's own get_kv_cache_spec on a stand-in that answers the layer's state questions the way
    # the model class answers them for vLLM's hybrid alignment (same shapes, same dtypes).
    layer = SimpleNamespace(
        get_state_shape=lambda: model_cls.get_mamba_state_shape_from_config(cfg),
        get_state_dtype=lambda: model_cls.get_mamba_state_dtype_from_config(cfg),
        mamba_type=getattr(model_cls, "mamba_type", "linear_attention"),
        is_kv_cache_tp_replicated=False,
    )
    return MambaBase.get_kv_cache_spec(layer, cfg)


def _resolve_layout(cfg, backend, specs: Dict[str, Any]) -> None:
    """vLLM >= 0.33 resolves one KV cache layout in the engine core before sizing the pool."""
    try:
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    except ImportError:
        return
    names = [layout.name for layout in get_supported_kv_cache_layouts([backend])]
    resolve_kv_cache_layout(cfg, [names], list(specs.values()))


def _kv_cache_config(cfg, specs: Dict[str, Any], kv_bytes: int):
    try:  # vLLM >= 0.33: the engine core groups the layers first, then sizes the pool
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    except ImportError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

        return get_kv_cache_configs(cfg, [dict(specs)], [kv_bytes])[0]
    groups = get_global_kv_cache_groups(cfg, [dict(specs)])
    return get_kv_cache_configs(cfg, [dict(specs)], [kv_bytes], groups)[0]


def _capacity(cfg, kv_cache_config) -> tuple[int, float]:
    """vLLM's "GPU KV cache size" tokens and "Maximum concurrency" for max_model_len requests."""
    from vllm.v1.core import kv_cache_utils

    if hasattr(kv_cache_utils, "get_kv_cache_capacity"):  # vLLM >= 0.26
        tokens, concurrency = kv_cache_utils.get_kv_cache_capacity(cfg, kv_cache_config)
        return int(tokens), float(concurrency)
    # vLLM 0.18 logs blocks per group times the smallest block size (_report_kv_cache_config).
    groups = kv_cache_config.kv_cache_groups
    block = min(g.kv_cache_spec.block_size for g in groups)
    tokens = kv_cache_config.num_blocks // len(groups) * block
    return tokens, float(kv_cache_utils.get_max_concurrency_for_kv_cache_config(cfg, kv_cache_config))


def _overlay_state() -> Dict[str, Any]:
    try:
        from govinda_patch import bootstrap
    except ImportError:
        return {"live": False}
    overlay = getattr(bootstrap, "OVERLAY", None)
    if overlay is None:
        return {"live": False}
    return {"live": True, "patches": {name: e.state for name, e in overlay.entries.items()}}


def kv_budget(request: Dict[str, Any], weights_bytes: Optional[int]) -> Dict[str, Any]:
    """The KV memory: given, or what vLLM leaves of gpu_mem x utilization after weights and overheads
    (vLLM's own accounting: requested memory minus weights, activation peak, non-torch memory and,
    from vLLM 0.21, the CUDA-graph estimate; the last three are ``overhead_gib``)."""
    if request.get("kv_cache_memory_bytes") is not None:
        return {"source": "given", "kv_bytes": int(request["kv_cache_memory_bytes"])}
    requested = int(request["gpu_mem_gib"] * GIB * request["gpu_memory_utilization"])
    overhead = int(request["overhead_gib"] * GIB)
    if weights_bytes is None:
        return {"source": "budget", "requested_bytes": requested, "overhead_bytes": overhead, "kv_bytes": None}
    return {"source": "budget", "requested_bytes": requested, "weights_bytes": weights_bytes,
            "overhead_bytes": overhead, "kv_bytes": requested - weights_bytes - overhead}


def _weights(request: Dict[str, Any], model_config) -> Dict[str, Any]:
    if request.get("weights_gib") is not None:
        return {"source": "given", "bytes": int(request["weights_gib"] * GIB)}
    try:
        return {"source": "config", **parameter_count(model_config, request["language_model_only"])}
    except UnsupportedModel as exc:
        return {"source": "config", "bytes": None, "why": str(exc)}


def _point(cfg, specs: Dict[str, Any], kv_bytes: Optional[int], request_lens: List[int]) -> Dict[str, Any]:
    """Capacity at one KV memory size, or why nothing fits."""
    if kv_bytes is None:
        return {"kv_bytes": None, "fits": False, "why": "no weight size (see weights)"}
    if kv_bytes <= 0:
        return {"kv_bytes": kv_bytes, "fits": False, "why": f"no memory left for the KV cache ({kv_bytes / GIB:.2f} GiB)"}
    try:
        kv_cache_config = _kv_cache_config(cfg, specs, kv_bytes)
    except ValueError as exc:  # vLLM's own "not enough KV cache memory for one request" check
        return {"kv_bytes": kv_bytes, "fits": False, "why": " ".join(str(exc).split())[:400]}
    tokens, concurrency = _capacity(cfg, kv_cache_config)
    return {"kv_bytes": kv_bytes, "fits": True, "num_blocks": kv_cache_config.num_blocks, "tokens": tokens,
            "max_concurrency": concurrency, "requests": int(math.floor(concurrency + 1e-9)),
            "requests_at": {str(n): _concurrency_at(cfg, kv_cache_config, n) for n in request_lens}}


def _concurrency_at(cfg, kv_cache_config, length: int) -> float:
    """vLLM's max concurrency for requests of ``length`` tokens (it reads max_model_len)."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    model_config = cfg.model_config
    saved = model_config.max_model_len
    model_config.max_model_len = length
    try:
        return float(get_max_concurrency_for_kv_cache_config(cfg, kv_cache_config))
    finally:
        model_config.max_model_len = saved


@dataclass
class KvLayout:
    """One model's KV cache as vLLM lays it out: the attention layer (backend chosen), its spec,
    the mamba spec of hybrid models, every layer's spec by name and the pool's layout."""

    layer: Any
    attention_spec: Any
    mamba_spec: Any
    attention_names: List[str]
    mamba_names: List[str]
    specs: Dict[str, Any]
    layout: Any  # KVCacheConfig of a pool that surely holds a request (its layout does not depend on its size)


def kv_layout(cfg) -> KvLayout:
    """vLLM's own specs and pool layout for ``cfg`` (raises CapacityError outside what this covers)."""
    _check_supported(cfg.model_config)
    layer, attention_spec = _attention_spec(cfg)
    attn_names, mamba_names = _layer_names(cfg.model_config, cfg.parallel_config)
    specs = {name: attention_spec for name in attn_names}
    mamba_spec = _mamba_spec(cfg) if mamba_names else None
    specs.update({name: mamba_spec for name in mamba_names})
    _resolve_layout(cfg, layer.get_attn_backend(), specs)
    layout = _kv_cache_config(cfg, specs, LAYOUT_PROBE_BYTES)
    return KvLayout(layer, attention_spec, mamba_spec, attn_names, mamba_names, specs, layout)


def probe(request: Dict[str, Any]) -> Dict[str, Any]:
    import vllm
    from vllm.platforms import current_platform

    with model_inspection_here():
        cfg = _engine_config(request)
        kv = kv_layout(cfg)
    model_config = cfg.model_config
    weights = _weights(request, model_config)
    budget = kv_budget(request, weights["bytes"])
    request_lens = [int(n) for n in request.get("request_lens") or []]
    return {
        "vllm": vllm.__version__, "platform": type(current_platform).__name__, "overlay": _overlay_state(),
        "model": request["model"], "architecture": model_config.architecture,
        "dtype": str(model_config.dtype).replace("torch.", ""), "max_model_len": model_config.max_model_len,
        "backend": kv.layer.get_attn_backend().get_name(), "attention_impl": type(kv.layer.impl).__name__,
        "kv_dtype": str(kv.attention_spec.dtype).replace("torch.", ""),
        "num_kv_heads": kv.attention_spec.num_kv_heads, "head_size": kv.attention_spec.head_size,
        "attention_layers": len(kv.attention_names), "mamba_layers": len(kv.mamba_names),
        "weights": weights, "budget": budget,
        **_pool_bytes(cfg, kv.layout, kv.attention_spec, kv.mamba_spec, len(kv.attention_names), len(kv.mamba_names)),
        "capacity": _point(cfg, kv.specs, budget["kv_bytes"], request_lens),
        "points": [_point(cfg, kv.specs, int(n), request_lens) for n in request.get("kv_points") or []],
    }


def _pool_bytes(cfg, kv_cache_config, attention_spec, mamba_spec, n_attn: int, n_mamba: int) -> Dict[str, Any]:
    """What one token and one request cost in vLLM's block pool, padding included.

    vLLM keeps group_size tensors, each shared by one layer of every group, so a block id costs
    group_size pages; an attention block holds block_size tokens of its group's layers, a request
    holds cdiv(max memory, page) blocks of each mamba group (its state), whatever its length.
    """
    from vllm.v1.kv_cache_interface import MambaSpec

    groups = kv_cache_config.kv_cache_groups
    group_size = max(len(g.layer_names) for g in groups)
    attention = [g for g in groups if not isinstance(g.kv_cache_spec, MambaSpec)]
    mamba = [g for g in groups if isinstance(g.kv_cache_spec, MambaSpec)]
    block = attention[0].kv_cache_spec.block_size
    page = attention[0].kv_cache_spec.page_size_bytes
    state = sum(-(-g.kv_cache_spec.max_memory_usage_bytes(cfg) // g.kv_cache_spec.page_size_bytes)
                * g.kv_cache_spec.page_size_bytes * group_size for g in mamba)
    return {
        "num_groups": len(groups), "group_size": group_size, "block_size": block, "page_bytes": page,
        "token_bytes": len(attention) * group_size * page / block,
        "token_bytes_unpadded": n_attn * attention_spec.page_size_bytes / attention_spec.block_size,
        "request_state_bytes": state,
        "request_state_bytes_unpadded": n_mamba * _real_page(mamba_spec) if mamba_spec is not None else 0,
    }


def _real_page(spec) -> int:
    """A mamba layer's state bytes before padding to the attention page."""
    real = getattr(spec, "real_page_size_bytes", None)
    if real is not None:
        return int(real)
    import dataclasses

    return int(dataclasses.replace(spec, page_size_padded=None).page_size_bytes)


def main(argv: List[str]) -> int:
    request = json.loads(argv[0])
    try:
        result = probe(request)
    except (CapacityError, UnsupportedModel) as exc:
        result = {"error": str(exc)}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
