"""QuantizedTensor: one quantized weight (format, shape, packed tensors) as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from app.errors import QwenTrayError
from app.formats import w3, w4
from app.formats.core import GROUP_SIZE, check_k

# Format name -> (bits, names of its tensors in checkpoint order).
FORMATS: dict[str, tuple[int, tuple[str, ...]]] = {
    "w4": (4, ("qweight", "scales")),
    "w3": (3, ("qlow", "qhigh", "scales")),
}
FORMAT_OF_BITS = {bits: fmt for fmt, (bits, _) in FORMATS.items()}


@dataclass(frozen=True)
class QuantizedTensor:
    """A weight W [N, K] stored as ``format`` ("w4" or "w3") in ``tensors``.

    ``tensors`` maps the format's tensor names to the packed tensors (see w4.py / w3.py);
    they are validated against ``shape`` here, so a loaded checkpoint with a wrong shape or
    dtype fails at load time with the tensor named.
    """

    format: str
    shape: tuple[int, int]
    tensors: dict[str, torch.Tensor] = field(repr=False)
    name: str = "weight"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise QwenTrayError(f"{self.name}: unknown quantized format {self.format!r} (known: {', '.join(FORMATS)})")
        n, k = self.shape
        check_k(k, self.name)
        expected = self.expected_shapes(self.format, n, k)
        if set(self.tensors) != set(expected):
            raise QwenTrayError(f"{self.name}: {self.format} needs tensors {sorted(expected)}, got {sorted(self.tensors)}")
        for key, (shape, dtype) in expected.items():
            t = self.tensors[key]
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise QwenTrayError(f"{self.name}.{key}: expected {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")

    @staticmethod
    def expected_shapes(fmt: str, n: int, k: int) -> dict[str, tuple[tuple[int, int], torch.dtype]]:
        scales = ((n, k // GROUP_SIZE), torch.float16)
        if fmt == "w4":
            return {"qweight": ((n, k // 8), torch.int32), "scales": scales}
        return {"qlow": ((n, k // 16), torch.int32), "qhigh": ((n, k // 32), torch.int32), "scales": scales}

    @property
    def bits(self) -> int:
        return FORMATS[self.format][0]

    @property
    def nbytes(self) -> int:
        """Bytes the packed values and scales occupy (what the GPU has to hold)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def bits_per_weight(self) -> float:
        return self.nbytes * 8 / (self.shape[0] * self.shape[1])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.format == "w4":
            return w4.dequantize_w4(self.tensors["qweight"], self.tensors["scales"], dtype)
        t = self.tensors
        return w3.dequantize_w3(t["qlow"], t["qhigh"], t["scales"], dtype)

    def matmul_ref(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 reference of ``x @ W.T`` (x [..., K] -> [..., N])."""
        if self.format == "w4":
            return w4.w4_matmul_ref(x, self.tensors["qweight"], self.tensors["scales"])
        t = self.tensors
        return w3.w3_matmul_ref(x, t["qlow"], t["qhigh"], t["scales"])

    def lookup_rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Embedding lookup: rows ``ids`` dequantized -> [*ids.shape, K]."""
        if self.format == "w4":
            return w4.embedding_lookup_ref(ids, self.tensors["qweight"], self.tensors["scales"], dtype)
        t = self.tensors
        return w3.embedding_lookup_w3_ref(ids, t["qlow"], t["qhigh"], t["scales"], dtype)

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        """Checkpoint entries ``{prefix}.qweight`` etc. (prefix = the module name)."""
        return {f"{prefix}.{key}": self.tensors[key] for key in FORMATS[self.format][1]}

    @classmethod
    def from_state_dict(cls, prefix: str, entries: dict[str, torch.Tensor]) -> QuantizedTensor:
        """Rebuild from checkpoint entries; the format is told by which tensors exist."""
        scales = entries.get(f"{prefix}.scales")
        if scales is None or scales.dim() != 2:
            raise QwenTrayError(f"{prefix}.scales: missing or not 2-D in the checkpoint")
        fmt = "w4" if f"{prefix}.qweight" in entries else "w3"
        keys = FORMATS[fmt][1]
        missing = [key for key in keys if f"{prefix}.{key}" not in entries]
        if missing:
            raise QwenTrayError(f"{prefix}: checkpoint lacks {', '.join(missing)} for format {fmt}")
        shape = (scales.shape[0], scales.shape[1] * GROUP_SIZE)
        return cls(fmt, shape, {key: entries[f"{prefix}.{key}"] for key in keys}, name=prefix)


def encode(w: torch.Tensor, bits: int, scales: torch.Tensor | None = None, *,
           name: str = "weight") -> QuantizedTensor:
    """W [N, K] as ``bits`` (4 -> "w4", 3 -> "w3") with the given fp32 ``scales`` [N, K/128],
    or round-to-nearest scales when None (the clipping search lives in app.quant.search)."""
    if bits not in FORMAT_OF_BITS:
        raise QwenTrayError(f"{name}: cannot quantize to {bits} bits (supported: 3, 4)")
    if bits == 4:
        qweight, scales = w4.quantize_w4(w, scales, name=name)
        tensors = {"qweight": qweight, "scales": scales}
    else:
        qlow, qhigh, scales = w3.quantize_w3(w, scales, name=name)
        tensors = {"qlow": qlow, "qhigh": qhigh, "scales": scales}
    return QuantizedTensor(FORMAT_OF_BITS[bits], (w.shape[0], w.shape[1]), tensors, name=name)
