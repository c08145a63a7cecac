"""Accuracy evidence for Govinda's INT8 KV cache (CPU, small real model, offline text)."""
