"""The plugin's own attention backend classes, registered under vLLM's enum names."""
