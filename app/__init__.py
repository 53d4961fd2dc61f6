"""Qwen Tray: a local-first desktop assistant running quantized Qwen2.5 / Llama models."""

__version__ = "0.1.0"
