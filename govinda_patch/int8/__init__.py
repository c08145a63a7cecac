"""The INT8 KV-cache feature: backend, KV-spec arithmetic, kernel self-test, tuner, counters.

The generic loader (``govinda_patch.manager`` and friends) knows nothing of this package; it is
reached only through ``patches.yaml``: the ``govinda_patch.patches.*`` wiring modules import it,
and the ``int8_kv`` group's ``guard: kernel_selftest`` resolves to ``guard.kernel_selftest``.
Importing this package imports neither torch nor vLLM (``backend`` does, and is imported by vLLM).
"""
