"""The shared core of the kernel benches (``bench.kernel_bench``, ``bench.kernel_accuracy``,
``bench.tune_decode``, ``bench.tune_vs_table``): run options and context (:mod:`.session`),
loading our kernels and vLLM's (:mod:`.loaders`), inputs and paged layouts (:mod:`.inputs`), the
contenders -- our kernels, vLLM's TRITON_ATTN and FA3 -- behind one interface
(:mod:`.contenders`), timing (:mod:`.timing`) and JSON records (:mod:`.records`).

No module here imports torch, Triton or vLLM at import time: ``session.prepare_environment``
must run first.
"""
