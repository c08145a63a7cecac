"""The contenders of the kernel benches behind one interface (``allocate``, ``store``,
``prepare_step``, ``attention``, ``dequantized_kv``, ``release``): our INT8 kernels, vLLM's
TRITON_ATTN backend (bf16 and upstream ``int8_per_token_head``) and FlashAttention-3."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from types import SimpleNamespace
from typing import Any, List, Optional, Tuple

from .inputs import Geometry, PagedLayout, Step
from .session import Context


@contextlib.contextmanager
def cpu_capability_shim(enabled: bool):
    """Smoke only: vLLM's bf16 cache writer reads the CUDA capability of the key's device for a
    tile-size heuristic; on the CPU there is none, so report an SM90 one for CPU tensors."""
    if not enabled:
        yield
        return
    import torch

    original = torch.cuda.get_device_capability

    def capability(device=None):
        if device is not None and torch.device(device).type == "cpu":
            return (9, 0)
        return original(device)

    torch.cuda.get_device_capability = capability
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original


class OursContender:
    """Our kernels; ``rotation`` ``"hadamard"`` as shipped (see ``bench.kernel_bench --rotation``), or
    ``"prepost"``: the same rotation as bf16 torch matmuls around the unrotated kernels (matrix
    preallocated, like an impl would)."""

    PREFIXES = {"none": "ours", "hadamard": "ours_rot", "prepost": "ours_rotpp"}

    def __init__(self, kernels: SimpleNamespace, geometry: Geometry, block_size: int, device, rotation: str = "none"):
        self.kernels = kernels
        self.geometry = geometry
        self.block_size = block_size
        self.device = device
        self.rotation = rotation
        self.kernel_rotation = "hadamard" if rotation == "hadamard" else "none"
        self.name = f"{self.PREFIXES[rotation]}_bs{block_size}"
        self.matrix = None
        self.cache = None
        self.workspace = None
        self.kv_bytes_per_token = kernels.layout.bytes_per_token(geometry.num_kv_heads, geometry.head_dim)
        # Launch configs passed to every call (None: the device's table); set with use_configs.
        self.configs = None

    def allocate(self, layout: PagedLayout) -> None:
        import torch

        g = self.geometry
        shape = self.kernels.layout.cache_shape(layout.num_blocks, self.block_size, g.num_kv_heads, g.head_dim)
        self.cache = torch.zeros(shape, dtype=torch.int8, device=self.device)
        self.block_table = layout.block_table
        self.max_decodes = max(len(layout.max_seq_lens), 1)
        self.use_configs(self.configs)

    def use_configs(self, configs) -> None:
        """Run with ``configs`` from now on (a workspace sized for their split policy)."""
        g = self.geometry
        self.configs = configs
        self.workspace = self.kernels.DecodeWorkspace.allocate(
            self.max_decodes, g.num_q_heads, g.head_dim, self.device, num_kv_heads=g.num_kv_heads, configs=configs
        )
        if self.rotation == "prepost":
            self.matrix = self.kernels.rotation.hadamard_matrix(g.head_dim, self.device, g.torch_dtype)

    def release(self) -> None:
        self.cache = None
        self.workspace = None
        self.matrix = None
        self.buffers = None

    def _rotated(self, x, out=None):
        """``x [..., D] @ H`` (bf16 in, fp32 accumulation, bf16 out) -- the pre/post design."""
        import torch

        flat = x.reshape(-1, x.shape[-1])
        if out is None:
            return torch.matmul(flat, self.matrix).view(x.shape)
        torch.matmul(flat, self.matrix, out=out.view(-1, x.shape[-1]))
        return out

    def store(self, key, value, slot_mapping) -> None:
        if self.rotation == "prepost":
            key, value = self._rotated(key), self._rotated(value)
        self.kernels.store_kv_int8(
            key, value, self.cache, slot_mapping, block_size=self.block_size, rotation=self.kernel_rotation
        )

    def prepare_step(self, step: Step) -> Step:
        if self.rotation == "prepost":
            import torch

            g = self.geometry
            shape = (step.num_tokens, g.num_q_heads, g.head_dim)
            # Preallocated: the timed call (and a captured graph) allocates nothing.
            self.buffers = tuple(torch.empty(shape, dtype=g.torch_dtype, device=self.device) for _ in range(2))
        return step

    def attention(self, query, output, step: Step) -> None:
        if self.rotation == "prepost":
            rotated_query, rotated_output = self.buffers
            self._attention(self._rotated(query, rotated_query), rotated_output, step)
            self._rotated(rotated_output, output)
            return
        self._attention(query, output, step)

    def _attention(self, query, output, step: Step) -> None:
        g = self.geometry
        self.kernels.paged_attention_int8(
            query,
            self.cache,
            output,
            step.query_start_loc,
            step.seq_lens_tensor,
            self.block_table,
            block_size=self.block_size,
            num_kv_heads=g.num_kv_heads,
            softmax_scale=g.softmax_scale,
            max_query_len=step.max_query_len,
            max_seq_len=step.max_seq_len,
            num_decodes=step.num_decodes,
            workspace=self.workspace,
            configs=self.configs,
            rotation=self.kernel_rotation,
            gathered_prefill=getattr(step, "gathered_prefill", None),
        )

    def dequantized_kv(self, layout: PagedLayout, seq_index: int, seq_len: int):
        g = self.geometry
        key, value = self.kernels.layout.gather_reference(
            self.cache, layout.block_table[seq_index], seq_len, self.block_size, g.num_kv_heads, g.head_dim
        )
        if self.rotation != "none":  # the page holds rotated rows
            key, value = self.kernels.rotation.hadamard_reference(key), self.kernels.rotation.hadamard_reference(value)
        return key, value


class VllmTritonContender:
    """vLLM's TRITON_ATTN backend for one kv-cache dtype ("auto" = bf16, or int8_per_token_head)."""

    def __init__(self, vllm_mod: SimpleNamespace, geometry: Geometry, block_size: int, cache_dtype: str, device):
        import torch

        self.vllm = vllm_mod
        self.geometry = geometry
        self.block_size = block_size
        self.cache_dtype = cache_dtype
        self.device = device
        label = "bf16" if cache_dtype == "auto" else "int8pth"
        self.name = f"vllm_{label}_bs{block_size}"
        if cache_dtype == "auto":
            self.torch_dtype = geometry.torch_dtype  # "auto" = the model dtype
            self.kv_bytes_per_token = 2 * geometry.num_kv_heads * geometry.head_dim * 2
        else:
            from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

            self.torch_dtype = STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
            # K and V rows of head_dim int8 plus one fp32 scale each (vLLM pads the head dim).
            self.kv_bytes_per_token = 2 * geometry.num_kv_heads * (geometry.head_dim + 4)
        # The layer object vLLM passes to the impl: only the default (1.0) tensor scales are read.
        one = torch.tensor(1.0, dtype=torch.float32, device=device)
        self.layer = SimpleNamespace(
            _k_scale=one,
            _v_scale=one.clone(),
            _q_scale=one.clone(),
            _prob_scale=one.clone(),
            _k_scale_float=1.0,
            _v_scale_float=1.0,
            _q_scale_float=1.0,
        )
        # Builder constants: threshold for the 3D (split-softmax) decode path and its buffers.
        module = vllm_mod.module
        self.seq_threshold_3d = module.MIN_LAUNCH_GRID_SIZE_2D // geometry.num_kv_heads
        self.num_segments = module.NUM_PAR_SOFTMAX_SEGMENTS
        padded = 1 << (geometry.head_dim - 1).bit_length()
        hq = geometry.num_q_heads
        self.segm_output = torch.empty(
            (self.seq_threshold_3d, hq, self.num_segments, padded), dtype=torch.float32, device=device
        )
        self.segm_max = torch.empty((self.seq_threshold_3d, hq, self.num_segments), dtype=torch.float32, device=device)
        self.segm_expsum = torch.empty_like(self.segm_max)
        self.impl = None
        self.kv_cache = None
        self.stride_order_source = None

    def _new_impl(self):
        g = self.geometry
        return self.vllm.impl_cls(
            num_heads=g.num_q_heads,
            head_size=g.head_dim,
            scale=g.softmax_scale,
            num_kv_heads=g.num_kv_heads,
            alibi_slopes=None,
            sliding_window=None,
            kv_cache_dtype=self.cache_dtype,
        )

    def _stride_order(self, ndim: int) -> Tuple[Tuple[int, ...], str]:
        return _vllm_stride_order(self.vllm.backend, ndim)

    def allocate(self, layout: PagedLayout) -> None:
        if hasattr(self.vllm.backend, "get_kv_cache_shape"):
            self.kv_cache = self._cache_from_backend_shape(layout.num_blocks)
        else:  # vLLM >= 0.33: the engine lays every cache out itself from the layer's spec
            self.kv_cache = self._cache_from_spec_views(layout.num_blocks)
        # The impl caches the per-token-head scale views of the first cache it sees.
        self.impl = self._new_impl()
        self.block_table = layout.block_table

    def _cache_from_backend_shape(self, num_blocks: int):
        """vLLM < 0.33: the backend's logical shape, allocated zeroed in its stride order."""
        import torch

        g = self.geometry
        shape = self.vllm.backend.get_kv_cache_shape(
            num_blocks, self.block_size, g.num_kv_heads, g.head_dim, cache_dtype_str=self.cache_dtype
        )
        order, self.stride_order_source = self._stride_order(len(shape))
        physical = tuple(shape[i] for i in order)
        inverse = [order.index(i) for i in range(len(order))]
        return torch.zeros(physical, dtype=self.torch_dtype, device=self.device).permute(*inverse)

    def _cache_from_spec_views(self, num_blocks: int):
        """vLLM >= 0.33: the layer's FullAttentionSpec (packed by the backend's customize_spec), the
        layout the backend prefers, and vLLM's own create_kv_cache_views over a zeroed int8 buffer
        (one layer, so a page per block)."""
        import torch
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheTensor, create_kv_cache_views, get_kv_quant_mode

        g = self.geometry
        spec = self.vllm.backend.customize_spec(FullAttentionSpec(
            block_size=self.block_size, num_kv_heads=g.num_kv_heads, head_size=g.head_dim,
            dtype=self.torch_dtype, kv_quant_mode=get_kv_quant_mode(self.cache_dtype)))
        kv_layout = get_supported_kv_cache_layouts([self.vllm.backend])[0]
        self.stride_order_source = f"create_kv_cache_views, layout {kv_layout.name}"
        page = spec.page_size_bytes
        raw = torch.zeros(num_blocks * page, dtype=torch.int8, device=self.device)
        placement = KVCacheTensor(size=raw.numel(), layers=["bench"], layer_stride=num_blocks * page, block_stride=page)
        (view,) = create_kv_cache_views(raw, spec, num_blocks, kv_layout, placement)
        return view

    def release(self) -> None:
        self.kv_cache = None
        self.impl = None

    def store(self, key, value, slot_mapping) -> None:
        self.impl.do_kv_cache_update(self.layer, key, value, self.kv_cache, slot_mapping)

    def prepare_step(self, step: Step):
        """The TritonAttentionMetadata TritonAttentionMetadataBuilder.build would produce."""
        values = dict(
            num_actual_tokens=step.num_tokens,
            max_query_len=step.max_query_len,
            query_start_loc=step.query_start_loc,
            max_seq_len=step.max_seq_len,
            seq_lens=step.seq_lens_tensor,
            block_table=self.block_table,
            slot_mapping=step.slot_mapping,
            seq_threshold_3D=self.seq_threshold_3d,
            num_par_softmax_segments=self.num_segments,
            softmax_segm_output=self.segm_output,
            softmax_segm_max=self.segm_max,
            softmax_segm_expsum=self.segm_expsum,
            causal=True,
            use_cascade=False,
            common_prefix_len=0,
            cu_prefix_query_lens=None,
            prefix_kv_lens=None,
            suffix_kv_lens=None,
        )
        fields = dataclasses.fields(self.vllm.metadata_cls)
        names = {field.name for field in fields}
        missing = [
            f.name
            for f in fields
            if f.name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        ]
        if missing:
            raise RuntimeError(f"TritonAttentionMetadata needs fields this bench does not know: {missing}")
        return self.vllm.metadata_cls(**{k: v for k, v in values.items() if k in names})

    def attention(self, query, output, metadata) -> None:
        self.impl.forward(self.layer, query, None, None, self.kv_cache, metadata, output)

    def dequantized_kv(self, layout: PagedLayout, seq_index: int, seq_len: int):
        """Float32 K, V ``[seq_len, H, D]`` as stored in this cache (dequantized for int8)."""
        import torch

        g = self.geometry
        positions = torch.arange(seq_len, device=self.device)
        blocks = layout.block_table[seq_index].long()[positions // self.block_size]
        offsets = positions % self.block_size
        if self.cache_dtype == "auto":
            # Mirrors TritonAttentionImpl.forward: (B, H, N, 2*hs) -> transpose -> split.
            if self.kv_cache.dim() == 5:  # vLLM <= 0.18: (B, 2, N, H, hs)
                key_cache, value_cache = self.kv_cache.unbind(1)
            else:
                key_cache, value_cache = self.kv_cache.transpose(1, 2).split(g.head_dim, dim=-1)
            return key_cache[blocks, offsets].float(), value_cache[blocks, offsets].float()
        key_cache, value_cache = self.impl._pth_key_value_caches(self.kv_cache)
        k_scale, v_scale = self.impl._k_scale_cache, self.impl._v_scale_cache
        key = key_cache[blocks, offsets][..., : g.head_dim].float() * k_scale[blocks, offsets].unsqueeze(-1)
        value = value_cache[blocks, offsets][..., : g.head_dim].float() * v_scale[blocks, offsets].unsqueeze(-1)
        return key, value


@functools.lru_cache(maxsize=None)
def _vllm_stride_order(backend, ndim: int) -> Tuple[Tuple[int, ...], str]:
    """The backend's KV-cache stride order, and how it was obtained."""
    try:
        return tuple(backend.get_kv_cache_stride_order()), "TritonAttentionBackend.get_kv_cache_stride_order()"
    except Exception as first_error:  # vLLM 0.26 reads the layout from the current VllmConfig
        try:
            from vllm.config import VllmConfig, set_current_vllm_config

            with set_current_vllm_config(VllmConfig()):
                order = tuple(backend.get_kv_cache_stride_order())
            return order, "TritonAttentionBackend.get_kv_cache_stride_order() under a default VllmConfig"
        except Exception as second_error:
            if ndim == 4:
                # Without a KV connector vLLM's layout is NHD (see get_kv_connector_cache_layout):
                # physical (blocks, block_size, heads, 2 * head) under the logical (blocks, heads, ...).
                return (0, 2, 1, 3), f"assumed NHD default ({first_error!r}; {second_error!r})"
            return tuple(range(ndim)), f"identity ({first_error!r}; {second_error!r})"


class Fa3Contender:
    """vLLM's FlashAttention-3 on a paged bf16 cache ``[num_blocks, block_size, Hkv, D]`` (K and V
    apart, as vLLM's FLASH_ATTN backend allocates them), one varlen call per step."""

    def __init__(self, fa, geometry: Geometry, block_size: int, device):
        self.fa = fa
        self.geometry = geometry
        self.block_size = block_size
        self.device = device
        self.name = f"fa3_bf16_bs{block_size}"
        self.kv_bytes_per_token = 2 * geometry.num_kv_heads * geometry.head_dim * 2
        self.key_cache = self.value_cache = None

    def allocate(self, layout: PagedLayout) -> None:
        import torch

        g = self.geometry
        shape = (layout.num_blocks, self.block_size, g.num_kv_heads, g.head_dim)
        self.key_cache = torch.zeros(shape, dtype=g.torch_dtype, device=self.device)
        self.value_cache = torch.zeros_like(self.key_cache)
        self.block_table = layout.block_table

    def release(self) -> None:
        self.key_cache = self.value_cache = None

    def store(self, key, value, slot_mapping) -> None:
        g = self.geometry
        self.key_cache.view(-1, g.num_kv_heads, g.head_dim)[slot_mapping] = key
        self.value_cache.view(-1, g.num_kv_heads, g.head_dim)[slot_mapping] = value

    def prepare_step(self, step: Step) -> Step:
        return step

    def attention(self, query, output, step: Step) -> None:
        self.fa.flash_attn_varlen_func(
            query, self.key_cache, self.value_cache,
            max_seqlen_q=step.max_query_len, cu_seqlens_q=step.query_start_loc,
            max_seqlen_k=step.max_seq_len, seqused_k=step.seq_lens_tensor, block_table=self.block_table,
            softmax_scale=self.geometry.softmax_scale, causal=True, out=output, fa_version=3,
        )

    def dequantized_kv(self, layout: PagedLayout, seq_index: int, seq_len: int):
        import torch

        positions = torch.arange(seq_len, device=self.device)
        blocks = layout.block_table[seq_index].long()[positions // self.block_size]
        offsets = positions % self.block_size
        return self.key_cache[blocks, offsets].float(), self.value_cache[blocks, offsets].float()


class OursFa3Contender(OursContender):
    """Our INT8 cache with the prefill on gather-dequantize + FA3 (``GOVINDA_PREFILL_KERNEL=fa3``);
    the host sizes come from the step's lists, as the metadata builder takes them from its CPU copies."""

    def __init__(self, kernels: SimpleNamespace, geometry: Geometry, block_size: int, device, varlen):
        super().__init__(kernels, geometry, block_size, device)
        self.name = f"ours_fa3_bs{block_size}"
        self.varlen = varlen

    def prepare_step(self, step: Step) -> Step:
        import torch

        step = dataclasses.replace(super().prepare_step(step))
        lens, query_lens = step.seq_lens[step.num_decodes :], step.query_lens[step.num_decodes :]
        if lens:
            cu, cu_q = [0], [0]
            for length, query_len in zip(lens, query_lens):
                cu.append(cu[-1] + length)
                cu_q.append(cu_q[-1] + query_len)
            step.gathered_prefill = self.kernels.GatheredPrefill(
                varlen_attention=self.varlen,
                cu_seqlens_k=torch.tensor(cu, dtype=torch.int32, device=self.device),
                cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=self.device),
                total_k=cu[-1], max_seqlen_k=max(lens), max_seqlen_q=max(query_lens),
                num_prefill_tokens=sum(query_lens),
            )
        return step


def build_fa3_contenders(ctx: Context, prefill: bool) -> List[Tuple[str, Any, Optional[str]]]:
    """--fa3: FA3 bf16 (the baseline, first), stock TRITON_ATTN bf16 (the ROCm default path), ours,
    and ours with the FA3 prefill (prefill cases)."""
    config, geometry, device = ctx.config, ctx.config.geometry, ctx.device
    fa3_name = f"fa3_bf16_bs{config.bf16_block_size}"
    ours_name, ours_fa3_name = f"ours_bs{config.ours_block_size}", f"ours_fa3_bs{config.ours_block_size}"
    fa, why_not = (None, "FA3 needs an NVIDIA GPU (smoke run on the CPU)") if ctx.smoke else ctx.fa3
    result: List[Tuple[str, Any, Optional[str]]] = [
        (fa3_name, Fa3Contender(fa, geometry, config.bf16_block_size, device) if fa else None, why_not)
    ]
    triton_name = f"vllm_bf16_bs{config.bf16_block_size}"
    if ctx.vllm is None:
        result.append((triton_name, None, f"vLLM not importable: {ctx.vllm_error}"))
    else:
        result.append((triton_name, VllmTritonContender(ctx.vllm, geometry, config.bf16_block_size, "auto", device), None))
    if ctx.ours is None:
        return result + [(ours_name, None, f"our kernels not importable: {ctx.ours_error}")]
    result.append((ours_name, OursContender(ctx.ours, geometry, config.ours_block_size, device), None))
    if prefill:
        varlen = ctx.fa3_varlen if fa else None
        contender = OursFa3Contender(ctx.ours, geometry, config.ours_block_size, device, varlen) if varlen else None
        result.append((ours_fa3_name, contender, None if contender else why_not))
    return result


def build_contenders(
    ctx: Context, include_small: bool = True, prefill: bool = False
) -> List[Tuple[str, Any, Optional[str]]]:
    """``(name, contender or None, reason when unavailable)``; the bf16 baseline comes first."""
    config, geometry, device = ctx.config, ctx.config.geometry, ctx.device
    result: List[Tuple[str, Any, Optional[str]]] = []
    if ctx.options.fa3:
        return build_fa3_contenders(ctx, prefill)
    if ctx.options.rotation:
        for rotation in ("none", "hadamard", "prepost"):
            name = f"{OursContender.PREFIXES[rotation]}_bs{config.ours_block_size}"
            if ctx.ours is None:
                result.append((name, None, f"our kernels not importable: {ctx.ours_error}"))
            else:
                result.append((name, OursContender(ctx.ours, geometry, config.ours_block_size, device, rotation), None))
        return result
    bf16_name = f"vllm_bf16_bs{config.bf16_block_size}"
    int8_name = f"vllm_int8pth_bs{config.int8pth_block_size}"
    if ctx.vllm is None:
        result.append((bf16_name, None, f"vLLM not importable: {ctx.vllm_error}"))
        result.append((int8_name, None, f"vLLM not importable: {ctx.vllm_error}"))
    else:
        result.append((bf16_name, VllmTritonContender(ctx.vllm, geometry, config.bf16_block_size, "auto", device), None))
        if ctx.vllm.int8pth_unavailable_reason is None:
            contender = VllmTritonContender(
                ctx.vllm, geometry, config.int8pth_block_size, "int8_per_token_head", device
            )
            result.append((int8_name, contender, None))
        else:
            result.append((int8_name, None, ctx.vllm.int8pth_unavailable_reason))
    sizes = [config.ours_block_size]
    if include_small and config.ours_small_block_size:
        sizes.append(config.ours_small_block_size)
    for size in sizes:
        name = f"ours_bs{size}"
        if ctx.ours is None:
            result.append((name, None, f"our kernels not importable: {ctx.ours_error}"))
        else:
            result.append((name, OursContender(ctx.ours, geometry, size, device), None))
    return result
