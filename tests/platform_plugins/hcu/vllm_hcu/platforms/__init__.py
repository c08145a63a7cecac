"""The stand-in's platform package (the real one resolves ``HCUPlatform`` lazily as well)."""
