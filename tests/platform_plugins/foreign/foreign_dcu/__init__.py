"""Stand-in for a vLLM platform plugin the overlay does not support, replacing vLLM's ROCm platform.

Put this folder on ``PYTHONPATH`` (with its dist-info): vLLM's plugin loader activates it, its
platform selects backends from a priority function of its own, which no patch of the overlay
targets, so the overlay must leave vLLM stock and say which plugin it met.
"""


def platform_plugin() -> str:
    return "foreign_dcu.platform.ForeignDcuPlatform"
