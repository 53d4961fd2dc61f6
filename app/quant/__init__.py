"""Quantized weight formats W4A16 / W3A16 in pure PyTorch (layouts: docs/FORMATS.md).

- :mod:`app.quant.w4`, :mod:`app.quant.w3`: pack / unpack / quantize / dequantize and the
  fp32 matmul and embedding references the CUDA kernels are checked against.
- :mod:`app.quant.search`: per-group clipping search (better than round-to-nearest).
- :mod:`app.quant.awq`: optional activation-aware per-input-channel scaling.
- :mod:`app.quant.tensor`: :class:`QuantizedTensor`, one quantized weight as data.
- :mod:`app.quant.recipe`: which tensor gets how many bits, and what a model then weighs.
"""

from app.quant.awq import ActivationStats, AwqResult, awq_search
from app.quant.core import GROUP_SIZE, quantized_nbytes
from app.quant.recipe import BUILTIN_RECIPES, ModelPlan, Recipe, hf_tensor_shapes, load_recipe, plan_model
from app.quant.search import search_scales
from app.quant.tensor import QuantizedTensor, quantize
from app.quant.w3 import dequantize_w3, embedding_lookup_w3_ref, pack_w3, quantize_w3, unpack_w3, w3_matmul_ref
from app.quant.w4 import dequantize_w4, embedding_lookup_ref, pack_w4, quantize_w4, unpack_w4, w4_matmul_ref

__all__ = [
    "GROUP_SIZE", "quantized_nbytes",
    "pack_w4", "unpack_w4", "quantize_w4", "dequantize_w4", "w4_matmul_ref", "embedding_lookup_ref",
    "pack_w3", "unpack_w3", "quantize_w3", "dequantize_w3", "w3_matmul_ref", "embedding_lookup_w3_ref",
    "search_scales", "ActivationStats", "AwqResult", "awq_search",
    "QuantizedTensor", "quantize",
    "Recipe", "BUILTIN_RECIPES", "load_recipe", "plan_model", "ModelPlan", "hf_tensor_shapes",
]
