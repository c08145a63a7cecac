"""Govinda: an INT8 KV-cache overlay for vLLM, applied at interpreter start-up."""
