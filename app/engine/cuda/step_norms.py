"""Which RMSNorms of a decode step are fused into the GEMV after them, and the buffers that feed them.

At batch 1 with quantized linears a norm can run inside the GEMV that reads its output
(app.kernels.gemv ``FusedNorm``): that GEMV takes the residual row h itself and the chunk sums
of squares the residual GEMV that wrote h left (``sums_out``). Three sites per step: the norm
before each qkv ("input"; not layer 0's, which follows the embedding lookup and gets no sums),
before each gate/up ("post", fed by the o projection) and before the lm_head ("final", fed by
the last down projection). Where a site is not fused the norm kernel writes ``normed``. Fused
and unfused are bit-equal (docs/KERNELS.md § Fused norms), so the choice is only about speed.
"""

from __future__ import annotations

import torch

from app.kernels.gemv import FusedNorm

SITES = ("input", "post", "final")


class StepNorms:
    """The norms of one step at batch b: ``sites`` are fused, the others run the norm kernel.
    The o projection writes its chunk sums to norm_sums[0], the down projection to norm_sums[1]."""

    def __init__(self, ops, buffers, eps: float, b: int, sites: frozenset[str]):
        self.ops, self.buffers, self.eps, self.b, self.sites = ops, buffers, eps, b, sites

    def before(self, site: str, weight: torch.Tensor, first: bool = False) -> tuple[torch.Tensor, FusedNorm | None]:
        """(x, norm) for the linear after the norm at ``site``: (h, its FusedNorm), or the norm
        kernel's output and None."""
        h = self.buffers.hidden[:self.b]
        if site in self.sites and not first:
            return h, FusedNorm(weight, self._sums(0 if site == "post" else 1), self.eps)
        y = self.buffers.normed[:self.b]
        self.ops.rms_norm(h, weight, self.eps, out=y)
        return y, None

    def sums_after_o(self) -> torch.Tensor | None:
        return self._sums(0) if "post" in self.sites else None

    def sums_after_down(self, last_layer: bool) -> torch.Tensor | None:
        return self._sums(1) if ("final" if last_layer else "input") in self.sites else None

    def _sums(self, which: int) -> torch.Tensor:
        return self.buffers.norm_sums[which, :self.b]
