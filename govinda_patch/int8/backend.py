"""Govinda's INT8-KV attention backend, registered as vLLM's ``CUSTOM`` attention backend.

KV cache: one raw int8 row of ``2*B*H*(D+4)`` bytes per block (layout in ``kernels/int8_kv_layout``).
The KV-cache spec patch reports that page to vLLM as a plain ``FullAttentionSpec`` with
``dtype=int8`` and ``head_size=D+4`` (the 4 extra int8 "columns" per row pay for the fp32 scale),
so every page-size computation in vLLM (allocation, hybrid alignment, unification) sees the right
bytes; vLLM 0.33 gets the same spec from ``customize_spec``. ``do_kv_cache_update`` quantizes K/V
on write; ``forward`` runs our paged attention.

It subclasses vLLM's abstract ``AttentionImpl`` directly (not TritonAttentionImpl), so no inherited
fused rope+KV path can ever write bf16 into the INT8 cache.

Imported only inside vLLM worker/engine processes (it imports vLLM and torch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from . import counters, prefill_kernel, prefill_warmup, tuner
from ..kernel_package import import_kernel
from ..settings import kv_rotation
from .kv_spec import BACKEND_NAME, SUPPORTED_HEAD_SIZES, check_hybrid_pages, int8_spec_for, model_head_size

logger = logging.getLogger("govinda")

_layout = import_kernel("int8_kv_layout")
_store = import_kernel("int8_kv_store")
_attention = import_kernel("int8_paged_attention")

def as_page_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """The ``[num_blocks, page]`` int8 rows the kernels address. vLLM < 0.33 allocates that shape
    (``get_kv_cache_shape``); 0.33 hands a 4-D ``[B, H, N, C]`` byte view whose pages are contiguous
    (``supported_kv_cache_layouts``), which is viewed as rows without a copy."""
    if kv_cache.dim() == 2:
        return kv_cache
    # Dense page: the inner dims, ordered by stride, tile the page without gaps (any order).
    inner = sorted((stride, size) for stride, size in zip(kv_cache.stride()[1:], kv_cache.shape[1:]) if size != 1)
    page = 1
    for stride, size in inner:
        if stride != page:
            raise ValueError(f"KV cache pages are not contiguous: shape {tuple(kv_cache.shape)}, strides {kv_cache.stride()}")
        page *= size
    return kv_cache.as_strided((kv_cache.shape[0], page), (kv_cache.stride(0), 1))


# Largest gathered context (sum of a step's prefill seq_lens) for the transient bf16 K/V buffer:
# 128K tokens = 512 MiB at 4 KiB per token (4 KV heads x D=256, or 8 x 128); a larger step runs
# the Triton prefill instead.
GATHER_TOKEN_CAP = 131072


def prefill_seq_lens_cpu(metadata: CommonAttentionMetadata):
    """CPU seq_lens exact for the prefill rows without a device read, or None.

    vLLM 0.26/0.33 set ``seq_lens_cpu_upper_bound`` (exact for prefill rows, optimistic only for
    async speculative decodes); 0.18 sets the private ``_seq_lens_cpu`` behind ``seq_lens_cpu``
    (whose property would copy from the device when it is unset).
    """
    for name in ("seq_lens_cpu_upper_bound", "_seq_lens_cpu"):
        value = getattr(metadata, name, None)
        if value is not None:
            return value
    return None


@dataclass
class GovindaInt8Metadata:
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_decodes: int
    workspace: object
    launch_configs: object = None  # the builder's (possibly tuned) kernels/launch_configs table
    gathered_prefill: object = None  # kernels' GatheredPrefill when prefills go to gather + FA3
    prefill_varlen: object = None  # the builder's varlen kernel for gathered prefills (None: Triton)


class GovindaInt8MetadataBuilder(AttentionMetadataBuilder[GovindaInt8Metadata]):
    # Full CUDA graphs for pure-decode batches (fixed split-KV grid); mixed batches run piecewise.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # The block size is final here (after vLLM unified page sizes): hybrid pages must match.
        check_hybrid_pages(vllm_config, kv_cache_spec, exact=True)
        mamba_page = vllm_config.cache_config.mamba_page_size_padded
        logger.info(
            "INT8 KV cache for %d layers: block_size=%d tokens, page=%d B%s, kv_rotation=%s",
            len(layer_names),
            kv_cache_spec.block_size,
            kv_cache_spec.page_size_bytes,
            "" if mamba_page is None else f", mamba page padded to {mamba_page} B",  # hybrid models only
            kv_rotation(),
        )
        # Decodes first: the kernel entry point needs them as a leading block of the batch.
        self._init_reorder_batch_threshold(1)
        model_config, parallel_config = vllm_config.model_config, vllm_config.parallel_config
        num_q_heads = model_config.get_num_attention_heads(parallel_config)
        num_kv_heads = model_config.get_num_kv_heads(parallel_config)
        # Fixed for the builder's lifetime, before any CUDA graph is captured (govinda_patch/int8/tuner.py).
        shape = tuner.TuneShape(
            head_dim=model_config.get_head_size(),
            num_q_heads=num_q_heads,
            num_kv_heads=num_kv_heads,
            block_size=kv_cache_spec.block_size,
            dtype="fp16" if model_config.dtype == torch.float16 else "bf16",
        )
        self.launch_configs, description = tuner.launch_configs_for(shape, device)
        logger.info("INT8 attention launch configs for %s: %s", shape.key(), description)
        self.prefill = prefill_kernel.resolve(self.launch_configs, shape.head_dim, device)
        self._pin = torch.device(device).type == "cuda"  # cu_seqlens_k goes to the device asynchronously
        logger.info("INT8 prefill kernel: %s", self.prefill.description)
        # Preallocated split-KV buffers: no allocation in the (CUDA-graph captured) decode path.
        self.workspace = _attention.DecodeWorkspace.allocate(
            vllm_config.scheduler_config.max_num_seqs,
            num_q_heads,
            model_config.get_head_size(),
            device,
            num_kv_heads=num_kv_heads,
            configs=self.launch_configs,
        )

    def _gathered_prefill(self, metadata: CommonAttentionMetadata, num_decodes: int):
        """Host-side sizes of the prefills for gather + FA3, from the metadata's CPU copies (no
        device read); None keeps this step on the Triton prefill."""
        seq_lens_cpu = prefill_seq_lens_cpu(metadata)
        num_seqs = metadata.seq_lens.shape[0]
        if seq_lens_cpu is None or seq_lens_cpu.shape[0] < num_seqs or num_seqs <= num_decodes:
            return None
        seq_lens = seq_lens_cpu[num_decodes:num_seqs].to(torch.int64)
        total_k = int(seq_lens.sum())
        if total_k <= 0 or total_k > GATHER_TOKEN_CAP:
            return None
        starts = metadata.query_start_loc_cpu[num_decodes : num_seqs + 1].to(torch.int64)
        # One pinned host tensor, one asynchronous copy: [cu_seqlens_k | cu_seqlens_q].
        host = torch.zeros(2 * (seq_lens.shape[0] + 1), dtype=torch.int32, pin_memory=self._pin)
        cu_seqlens_k, cu_seqlens_q = host.view(2, -1)
        torch.cumsum(seq_lens, 0, out=cu_seqlens_k[1:])
        cu_seqlens_q.copy_(starts - starts[0])
        device_cu = host.to(self.device, non_blocking=True).view(2, -1)
        return _attention.GatheredPrefill(
            varlen_attention=self.prefill.varlen_attention,
            cu_seqlens_k=device_cu[0],
            cu_seqlens_q=device_cu[1],
            total_k=total_k,
            max_seqlen_k=int(seq_lens.max()),
            max_seqlen_q=int((starts[1:] - starts[:-1]).max()),
            num_prefill_tokens=int(starts[-1] - starts[0]),
        )

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False):
        num_decodes, _, _, _ = split_decodes_and_prefills(common_attn_metadata, decode_threshold=1)
        gathered = None
        if self.prefill.varlen_attention is not None:
            gathered = self._gathered_prefill(common_attn_metadata, num_decodes)
        return GovindaInt8Metadata(
            num_actual_tokens=common_attn_metadata.num_actual_tokens,
            max_query_len=common_attn_metadata.max_query_len,
            max_seq_len=common_attn_metadata.max_seq_len,
            query_start_loc=common_attn_metadata.query_start_loc,
            seq_lens=common_attn_metadata.seq_lens,
            block_table=common_attn_metadata.block_table_tensor,
            slot_mapping=common_attn_metadata.slot_mapping,
            num_decodes=num_decodes,
            workspace=self.workspace,
            launch_configs=self.launch_configs,
            gathered_prefill=gathered,
            prefill_varlen=self.prefill.varlen_attention,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata):
        metadata = self.build(0, common_attn_metadata)
        # Warm-up runs before capture would otherwise attend over max_model_len tokens.
        metadata.seq_lens.fill_(1)
        return metadata


class GovindaInt8AttentionBackend(AttentionBackend):
    accept_output_buffer: bool = True  # vLLM 0.18 reads this; later versions ignore it
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls():
        return GovindaInt8AttentionImpl

    @staticmethod
    def get_builder_cls():
        return GovindaInt8MetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):  # vLLM 0.33 passes the spec
        return [MultipleOf(16)]

    @classmethod
    def customize_spec(cls, spec):
        """vLLM >= 0.33 asks the backend for its page (hybrid alignment, the runner's KV specs).
        A spec the KV-spec patch already made INT8 is returned as it is."""
        if spec.dtype == torch.int8:
            return spec
        return int8_spec_for(spec)

    @classmethod
    def supported_kv_cache_layouts(cls):
        """vLLM >= 0.33 lays the cache out itself; our kernels need each (layer, block) page as
        one contiguous byte run, i.e. a block-compact layout."""
        from vllm.v1.kv_cache_layout import KVCacheLayout

        return tuple(layout for layout in KVCacheLayout if layout.is_block_compact)

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or block_size % 16 == 0

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        """One int8 row per block. ``head_size`` is the spec's (D + 4), see the module docstring."""
        if block_size % 16 != 0:
            raise ValueError(f"block size {block_size} is not a multiple of 16")
        return _layout.cache_shape(num_blocks, block_size, num_kv_heads, model_head_size(head_size))

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        return (1, 0, 2) if include_num_layers_dimension else (0, 1)

    @staticmethod
    def use_cascade_attention(*args, **kwargs) -> bool:
        return False

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return head_size in SUPPORTED_HEAD_SIZES

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype) -> bool:
        return kv_cache_dtype is None or kv_cache_dtype == "auto"

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_mm_prefix(cls) -> bool:
        return False

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return True


class GovindaInt8AttentionImpl(AttentionImpl):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes=None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks=None,
        **unsupported_options,
    ) -> None:
        unsupported = {
            "alibi_slopes": alibi_slopes is not None,
            "sliding_window": sliding_window is not None,
            "logits_soft_cap": bool(logits_soft_cap),
            "sinks": sinks is not None,
            "non-decoder attention": attn_type != AttentionType.DECODER,
            "kv_cache_dtype != auto": kv_cache_dtype != "auto",
            "head size": head_size not in SUPPORTED_HEAD_SIZES,
        }
        unsupported.update({k: bool(v) and v != -1 for k, v in unsupported_options.items()})
        requested = sorted(k for k, v in unsupported.items() if v)
        if requested:
            raise NotImplementedError(f"Govinda INT8 attention does not support: {requested}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sliding_window = None
        self.alibi_slopes = None
        self.sinks = None
        self.logits_soft_cap = None
        self._page_bytes_per_token = _layout.bytes_per_token(self.num_kv_heads, head_size)
        # Read once per layer from the environment, which every process of the server shares;
        # the store and the attention kernels must use the same one.
        self.kv_rotation = kv_rotation()
        self._prefill_warmed = False

    def _warm_prefill(self, query, kv_cache, attn_metadata: GovindaInt8Metadata) -> None:
        """Compile the prefill path in vLLM's warm-up (govinda_patch/int8/prefill_warmup.py)."""
        self._prefill_warmed = True
        try:
            prefill_warmup.warm_prefill(
                query, kv_cache, attn_metadata.block_table, block_size=self._block_size(kv_cache),
                num_kv_heads=self.num_kv_heads, softmax_scale=self.scale, configs=attn_metadata.launch_configs,
                rotation=self.kv_rotation, varlen=attn_metadata.prefill_varlen,
            )
        except Exception as exc:  # the first real prefill then compiles (and reports) it itself
            logger.warning("INT8 prefill warm-up failed (%s: %s); the first prefill compiles its kernels",
                           type(exc).__name__, str(exc)[:200])

    def _block_size(self, kv_cache: torch.Tensor) -> int:
        return kv_cache.shape[1] // self._page_bytes_per_token

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        kv_cache = as_page_rows(kv_cache)
        _store.store_kv_int8(
            key, value, kv_cache, slot_mapping, block_size=self._block_size(kv_cache), rotation=self.kv_rotation
        )
        counters.bump("kv_store_calls")

    def forward(
        self,
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata: GovindaInt8Metadata,
        output=None,
        output_scale=None,
        output_block_scale=None,
        **unused,
    ):
        assert output is not None, "vLLM must pass an output buffer"
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported by Govinda INT8 attention")
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        kv_cache = as_page_rows(kv_cache)
        if not self._prefill_warmed and query.is_cuda and not torch.cuda.is_current_stream_capturing():
            self._warm_prefill(query, kv_cache, attn_metadata)
        num_tokens = attn_metadata.num_actual_tokens
        _attention.paged_attention_int8(
            query[:num_tokens],
            kv_cache,
            output[:num_tokens],
            attn_metadata.query_start_loc,
            attn_metadata.seq_lens,
            attn_metadata.block_table,
            block_size=self._block_size(kv_cache),
            num_kv_heads=self.num_kv_heads,
            softmax_scale=self.scale,
            max_query_len=attn_metadata.max_query_len,
            max_seq_len=attn_metadata.max_seq_len,
            num_decodes=attn_metadata.num_decodes,
            workspace=attn_metadata.workspace,
            configs=attn_metadata.launch_configs,
            rotation=self.kv_rotation,
            gathered_prefill=attn_metadata.gathered_prefill,
        )
        num_seqs = attn_metadata.seq_lens.shape[0]
        if attn_metadata.num_decodes:
            counters.bump("decode_attention_calls")
        if num_seqs > attn_metadata.num_decodes:
            counters.bump("prefill_attention_calls")
            if attn_metadata.gathered_prefill is not None:
                counters.bump("prefill_fa3_calls")
        return output
