"""The inference engine: model spec, loading, static KV cache, sampling, scheduling.

It knows no screen and no HTTP; see docs/ENGINE_API.md for the contract.
"""

from app.engine.engine import Engine, resolve_device
from app.engine.params import GenerationResult, SamplingParams, Usage
from app.engine.request import PRIORITY_BACKGROUND, PRIORITY_INTERACTIVE, PRIORITY_NORMAL, Generation
from app.formats.spec import ModelSpec

__all__ = [
    "Engine", "Generation", "GenerationResult", "ModelSpec", "PRIORITY_BACKGROUND", "PRIORITY_INTERACTIVE",
    "PRIORITY_NORMAL", "SamplingParams", "Usage", "resolve_device",
]
