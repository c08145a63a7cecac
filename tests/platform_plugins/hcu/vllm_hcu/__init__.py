"""Stand-in for Hygon's vLLM platform plugin ``vllm_hcu`` (HYGON-AI/vllm-plugin-das), for tests.

The real package needs a DCU (and its compiled ops) to install, so the overlay's support for it is
tested with this distribution of the same shape, put on ``PYTHONPATH`` together with its
``vllm_hcu-*.dist-info`` (vLLM finds it through its ``vllm.platform_plugins`` entry point, as it
finds the real one): the entry point ``hcu`` returns the platform class path unconditionally;
``vllm_hcu.platforms.hcu`` keeps a module-level ``functools.cache``'d
``_get_backend_priorities(use_mla, use_sparse)`` that ``HCUPlatform.get_valid_backends`` calls
positionally, and registers the plugin's own TRITON_ATTN class. The device is the simulated DCU
(tests/dcu_sim). Written for these tests; no code of the vendor's is copied.
"""


def hcu_platform_plugin() -> str:
    return "vllm_hcu.platforms.hcu.HCUPlatform"
