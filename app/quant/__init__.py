"""Quantized weight formats W4A16 / W3A16 in pure PyTorch (layouts: docs/FORMATS.md).

- :mod:`app.quant.w4`, :mod:`app.quant.w3`: pack / unpack / quantize / dequantize and the
  fp32 matmul and embedding references the CUDA kernels are checked against.
- :mod:`app.quant.search`: per-group clipping search (better than round-to-nearest).
- :mod:`app.quant.awq`: optional activation-aware per-input-channel scaling.
- :mod:`app.quant.tensor`: :class:`QuantizedTensor`, one quantized weight as data.
- :mod:`app.quant.recipe`: which tensor gets how many bits, and what a model then weighs.
"""

import importlib

# Names are imported on first use (PEP 562), so `qwen-tray --help`, which imports the quant
# CLI, does not pay for importing torch.
_EXPORTS = {
    "awq": ("ActivationStats", "AwqResult", "awq_search"),
    "core": ("GROUP_SIZE", "quantized_nbytes"),
    "recipe": ("BUILTIN_RECIPES", "ModelPlan", "Recipe", "hf_tensor_shapes", "load_recipe", "plan_model"),
    "search": ("search_scales",),
    "tensor": ("QuantizedTensor", "quantize"),
    "w3": ("dequantize_w3", "embedding_lookup_w3_ref", "pack_w3", "quantize_w3", "unpack_w3", "w3_matmul_ref"),
    "w4": ("dequantize_w4", "embedding_lookup_ref", "pack_w4", "quantize_w4", "unpack_w4", "w4_matmul_ref"),
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
