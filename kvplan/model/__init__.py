"""The model layer: reading a config into per-layer cache specs, geometry, parameter counts and quantization."""
