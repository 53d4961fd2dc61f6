"""The engine's quantized runtime: a checkpoint's weights (app.formats) as modules that compute.

:mod:`~app.engine.quantized.modules` holds QuantLinear / QuantEmbedding swapped into the decoder
and the backend seam (dense reference, CPU int4, or the CUDA GEMVs set by app.engine.cuda);
:mod:`~app.engine.quantized.cpu_int4` is the CPU's 4-bit backend.
"""
