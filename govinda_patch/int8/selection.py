"""Which attention backend vLLM selected, for the members of ``int8_kv`` that shape KV pages.

The KV-cache spec and the hybrid page alignment turn INT8 only when the backend vLLM selected for
the layer is ours; the plan alone (patches applied, group active) is not enough, since vLLM may
still pick another backend (its validation, a backend the model pins, a platform whose priority
list is not patched). Where vLLM has not selected yet (vLLM 0.18's hybrid alignment runs in the
API-server process, before any layer exists) the platform's selection is asked the way the
selector asks it. When the INT8 backend would serve a layer but vLLM picked another, the layer
keeps stock pages and the process logs one WARNING saying why.
"""

from __future__ import annotations

import logging
import sys

from ..excerpt import clip
from ..patching import is_govinda_wrapper
from ..vllm_platform import resolved_class
from .kv_spec import BACKEND_PATH

logger = logging.getLogger("govinda")

_warned: list[str] = []  # one line per process


def path_of(backend) -> str:
    if isinstance(backend, str):
        return backend
    return f"{getattr(backend, '__module__', '?')}.{getattr(backend, '__qualname__', backend)}"


def is_int8(backend) -> bool:
    return backend is not None and path_of(backend) == BACKEND_PATH


def name_of(backend) -> str:
    try:
        return str(backend.get_name())
    except Exception:
        return clip(path_of(backend), 120)


def selector_config(vllm_config):
    """The ``AttentionSelectorConfig`` a full-attention layer of this model asks vLLM with."""
    from vllm.v1.attention.selector import AttentionSelectorConfig

    model_config, cache_config = vllm_config.model_config, vllm_config.cache_config
    wanted = {
        "head_size": model_config.get_head_size(),
        "dtype": model_config.dtype,
        "kv_cache_dtype": cache_config.cache_dtype,
        "block_size": cache_config.block_size if getattr(cache_config, "user_specified_block_size", False) else None,
        "use_mla": bool(getattr(model_config, "use_mla", False)),
    }
    return AttentionSelectorConfig(**{k: v for k, v in wanted.items() if k in AttentionSelectorConfig._fields})


def predicted_backend(vllm_config, config=None):
    """The backend class vLLM's platform selects for the model's full-attention layers (vLLM 0.18:
    ``Attention.__init__`` -> ``get_attn_backend`` -> ``current_platform.get_attn_backend_cls``)."""
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname

    config = config if config is not None else selector_config(vllm_config)
    path = current_platform.get_attn_backend_cls(vllm_config.attention_config.backend, attn_selector_config=config)
    return resolve_obj_by_qualname(path)


def why_not(config=None) -> str:
    """Why vLLM passed over the INT8 backend, as far as can be told from here."""
    platform_cls = resolved_class()
    module = sys.modules.get(getattr(platform_cls, "__module__", ""), None)
    priorities = getattr(module, "_get_backend_priorities", None)
    if priorities is not None and not is_govinda_wrapper(priorities):
        return f"the priority list of {platform_cls.__name__} ({module.__name__}._get_backend_priorities) does not lead with it"
    if config is not None:
        try:
            from vllm.platforms import current_platform

            from .backend import GovindaInt8AttentionBackend

            reasons = GovindaInt8AttentionBackend.validate_configuration(
                device_capability=current_platform.get_device_capability(), **config._asdict()
            )
        except Exception as exc:
            reasons = [f"(its validation could not be repeated: {type(exc).__name__}: {clip(exc, 120)})"]
        if reasons:
            return "vLLM's validation rejected it: " + clip("; ".join(map(str, reasons)), 300)
    return "vLLM's validation, or a backend the model chose itself, passed over it"


def warn_not_selected(selected, what: str, consequence: str, vllm_config=None, why: str | None = None, config=None) -> None:
    """The process's one WARNING that vLLM selected ``selected`` where the INT8 backend would serve."""
    if _warned:
        return
    if why is None and config is None and vllm_config is not None:
        try:
            config = selector_config(vllm_config)
        except Exception:  # the reason then says less, the line is still logged
            config = None
    chosen = name_of(selected) if selected is not None else "no backend it could tell"
    line = f"vLLM selected {chosen}, not the INT8 backend, for {what}: {why or why_not(config)}; {consequence}"
    _warned.append(line)
    logger.warning(line)
