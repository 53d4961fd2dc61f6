"""The formats the engine reads and the quantizer writes (docs/FORMATS.md).

Data and plain-PyTorch reference arithmetic only: this package imports no other part of the
app but its errors and folders, so the engine, the kernels and the quantizer can all build
on it.

- :mod:`app.formats.spec`: ModelSpec, a model's shapes from its config.json.
- :mod:`app.formats.core`, :mod:`app.formats.w4`, :mod:`app.formats.w3`: W4A16 / W3A16
  pack / unpack / round-to-nearest / dequantize and the matmul and embedding references the
  CUDA kernels are checked against.
- :mod:`app.formats.tensor`: :class:`QuantizedTensor`, one quantized weight as data.
- :mod:`app.formats.recipe`: which tensor gets how many bits, and what a model then weighs.
- :mod:`app.formats.checkpoint`: the checkpoint folder (manifest, one safetensors file per
  layer, sha256 validation); :mod:`app.formats.verified`: files already verified.
"""
