"""The offline quantizer (`qwen-tray quantize`): reads a Hugging Face folder through the engine's
loaders and writes a checkpoint in the formats of :mod:`app.formats` (docs/FORMATS.md).

- :mod:`app.quant.search`: per-group clipping search (better than round-to-nearest) and
  :func:`quantize`, one weight to a :class:`~app.formats.tensor.QuantizedTensor`.
- :mod:`app.quant.awq`: optional activation-aware per-input-channel scaling.
- :mod:`app.quant.calibration`: the activation statistics of a calibration text.
- :mod:`app.quant.quantizer`, :mod:`app.quant.resume`: one layer at a time, resumable.
"""

import importlib

# Names are imported on first use (PEP 562), so `qwen-tray --help`, which imports the quant
# CLI, does not pay for importing torch.
_EXPORTS = {
    "awq": ("ActivationStats", "AwqResult", "awq_search"),
    "search": ("quantize", "search_scales"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'app.quant' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"app.quant.{module}"), name)
    globals()[name] = value
    return value
