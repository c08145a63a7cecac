"""The plugin's TRITON_ATTN: vLLM's Triton backend under another class (the real one adds HCU kernels)."""

from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend


class HcuTritonAttentionBackend(TritonAttentionBackend):
    pass
