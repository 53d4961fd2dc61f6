"""Error-compensating quantization (GPTQ / Optimal Brain Quantization) into the W4/W3 formats.

Round-to-nearest and the clipping search quantize every weight on its own. GPTQ quantizes the
columns (input channels) of W [N, K] one after another and, after each, moves the rounding
error onto the columns not quantized yet, weighted by how the layer's inputs correlate: it
minimises the output error ``||X W^T - X Q^T||^2`` over calibration inputs X, whose Hessian
is ``H = 2 X^T X``. With ``U = chol_upper(H^-1)`` the update after column j is

    err = (w_j - q_j) / U[j, j];    W[:, j+1:] -= err * U[j, j+1:]

done lazily in blocks of 128 columns (one rank-128 update of the rest per block). Rows are
independent, so W is processed in row chunks with one ``U``: an embedding-sized head never
needs a full fp32 copy.

The output is exactly the existing format: signed integers per (row, 128-column group) with
one fp16 scale per group (:mod:`app.formats.w4`, :mod:`app.formats.w3`). Scales are chosen
either when the pass reaches a group (``dynamic``: from the already-updated weights, by the
activation-weighted clipping search of :mod:`app.quant.search`), or all up front from the
original weights (``static``). Act-order (columns in order of decreasing ``H[j, j]``)
permutes the columns; it is only allowed with static scales, so every column still uses its
own original group's scale (the "static groups" approach of AutoGPTQ/GPTQModel) and the
stored layout is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.errors import QwenTrayError
from app.formats import w3, w4
from app.formats.core import GROUP_SIZE, check_weight, qrange, row_chunks, rtn_scales_fp32, to_fp16_scales
from app.formats.tensor import FORMAT_OF_BITS, QuantizedTensor
from app.quant.search import search_scales

# Rows per chunk: the fp32 working copy of a chunk stays near this many values (~64 MiB).
GPTQ_CHUNK_ELEMENTS = 1 << 24
# Columns per lazy update of the rest of W (GPTQ's block); independent of the group size.
BLOCK = 128


@dataclass(frozen=True)
class GptqSettings:
    """How GPTQ runs. ``damp``: share of the mean diagonal added to H (keeps H invertible when
    the calibration has fewer tokens than inputs). ``scales``: "search" (activation-weighted
    clipping search) or "rtn" per group. ``static``: scales from the original weights before
    the pass (required by ``act_order``). ``sequential``: layer i's Hessians come from inputs
    that passed through the already-quantized layers 0..i-1 (GPTQ's paper), not the float ones
    (the quantizer's business; the solver does not read it)."""

    damp: float = 0.01
    scales: str = "search"
    static: bool = False
    act_order: bool = False
    sequential: bool = False
    group_size: int = GROUP_SIZE  # only 128 packs into the formats; 32 is for quality studies

    def __post_init__(self) -> None:
        if not 0.0 < self.damp <= 1.0:
            raise ValueError(f"damp must be in (0, 1], got {self.damp}")
        if self.scales not in ("search", "rtn"):
            raise ValueError(f"scales must be 'search' or 'rtn', got {self.scales!r}")
        if self.group_size not in (32, 64, GROUP_SIZE):
            raise ValueError(f"group_size must be 32, 64 or {GROUP_SIZE}, got {self.group_size}")
        if self.act_order and not self.static:
            raise ValueError("act_order needs static scales: a permuted pass would otherwise mix groups")


class HessianProbe:
    """Accumulates ``X^T X`` (fp32, on ``device``) of a linear's inputs; a forward pre-hook."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.sum: torch.Tensor | None = None
        self.count = 0

    def __call__(self, module, args) -> None:
        self.add(args[0])

    def add(self, x: torch.Tensor) -> None:
        flat = x.reshape(-1, x.shape[-1]).to(self.device, torch.float32)  # [tokens, K]
        if self.sum is None:
            self.sum = torch.zeros(flat.shape[1], flat.shape[1], device=self.device)
        self.sum.addmm_(flat.T, flat)
        self.count += flat.shape[0]

    def hessian(self) -> torch.Tensor:
        """``2 X^T X / tokens`` [K, K] (the scale does not change the result; it keeps H readable).
        The sum is handed over, scaled in place (a 7B down_proj's is 1.4 GiB), and the probe is spent."""
        if self.sum is None:
            raise RuntimeError("HessianProbe saw no inputs, or its Hessian was already taken")
        total, self.sum = self.sum, None
        return total.mul_(2.0 / self.count)


@torch.inference_mode()  # the Hessian may come from the calibration pass, an inference tensor
def inverse_cholesky_upper(hessian: torch.Tensor, damp: float, name: str, *, overwrite: bool = False) -> torch.Tensor:
    """``chol_upper((H + damp * mean(diag H) * I)^-1)`` [K, K] fp32: U with H^-1 = U^T U.

    Inputs never seen in calibration (zero diagonal, e.g. the zero padding to 128 columns) get a
    diagonal of 1 so H stays invertible; their columns are then plain rounding. Computed without
    a second K x K matrix (a 18944-wide down_proj's is ~1.4 GiB; ``cholesky_inverse`` would copy
    it, twice on CUDA): with J the reversal, J H J = M M^T gives H = R R^T for the upper R = J M J,
    so U = R^-1 = J M^-1 J -- a Cholesky factor and a triangular inverse, both in place.
    ``overwrite=True`` uses ``hessian`` itself as that matrix.
    """
    h = hessian if overwrite and hessian.dtype == torch.float32 else hessian.to(torch.float32).clone()
    diag = h.diagonal()
    diag[diag <= 0] = 1.0
    diag.add_(damp * float(diag.mean()))
    _reverse_(h)
    info = torch.empty((), dtype=torch.int32, device=h.device)
    # LAPACK/cuSOLVER work in column-major order: h's transpose is h's memory read that way (and
    # the same matrix), so no column-major copy is made; U^T of the column-major factor is M.
    torch.linalg.cholesky_ex(h.mT, upper=True, out=(h.mT, info))
    if int(info) != 0:
        raise QwenTrayError(f"{name}: the calibration Hessian is not positive definite even with damping; "
                            "use a longer calibration text")
    h.tril_()  # M; nothing above the diagonal, which the block inverse reads
    _invert_lower_(h)
    return _reverse_(h)


def _reverse_(h: torch.Tensor, block_rows: int = 256) -> torch.Tensor:
    """``J h J`` (rows and columns in reverse order) written into ``h``: mirrored row blocks swapped
    through one spare block (never a copy between overlapping rows, which a GPU would race on)."""
    k = h.shape[0]
    for top in range(0, k // 2, block_rows):
        rows = min(block_rows, k // 2 - top)
        low = h[k - top - rows:k - top]  # the rows that land in h[top:top + rows], in reverse
        upper = h[top:top + rows].flip(0, 1).clone()
        h[top:top + rows] = low.flip(0, 1)
        low.copy_(upper)
    if k % 2:  # the middle row is its own mirror
        h[k // 2] = h[k // 2].flip(0).clone()
    return h


def _invert_lower_(m: torch.Tensor, leaf: int = 256, chunk: int = 512) -> None:
    """A lower-triangular ``m`` (zero above the diagonal) replaced by its inverse, in place:
    [[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]], the off-diagonal block updated in
    row then column chunks, so the extra memory is a few chunks, not a matrix."""
    n = m.shape[0]
    if n <= leaf:
        eye = torch.eye(n, dtype=m.dtype, device=m.device)
        m.copy_(torch.linalg.solve_triangular(m, eye, upper=False))
        return
    half = n // 2
    a, b, c = m[:half, :half], m[half:, :half], m[half:, half:]
    _invert_lower_(a, leaf, chunk)
    _invert_lower_(c, leaf, chunk)
    for rows in range(0, b.shape[0], chunk):  # B A^-1: a row of the product needs that row of B only
        b[rows:rows + chunk] = b[rows:rows + chunk] @ a
    for cols in range(0, b.shape[1], chunk):  # -C^-1 (B A^-1): a column needs that column only
        b[:, cols:cols + chunk] = (c @ b[:, cols:cols + chunk]).neg_()


@torch.inference_mode()  # as inverse_cholesky_upper: the Hessian may be an inference tensor
def permute_symmetric_(h: torch.Tensor, perm: torch.Tensor, block_rows: int = 256) -> torch.Tensor:
    """``h[perm][:, perm]`` written into ``h`` itself, for act-order: rows moved along the
    permutation's cycles (one spare row), then columns a block of rows at a time (one spare block),
    so a 18944-wide down_proj's 1.4 GiB Hessian is never held twice more."""
    order = perm.tolist()
    done = [False] * len(order)
    for start, target in enumerate(order):
        if done[start] or target == start:
            continue
        first, i = h[start].clone(), start
        while order[i] != start:  # row i takes row order[i], not yet overwritten on this cycle
            done[i] = True
            h[i] = h[order[i]]
            i = order[i]
        done[i] = True
        h[i] = first
    for rows in range(0, h.shape[0], block_rows):
        block = h[rows:rows + block_rows]
        block.copy_(block[:, perm])
    return h


class GptqSolver:
    """The factorised Hessian of one input (shared by every weight reading it), ready to quantize.

    ``hessian`` [K, K] is ``2 X^T X`` of the calibration inputs; ``device`` runs the pass there
    (e.g. "cuda"). q/k/v (and gate/up) share their input, so one solver serves all of them,
    and an embedding-sized head is quantized row chunk by row chunk with one factorisation.
    """

    def __init__(self, hessian: torch.Tensor, settings: GptqSettings = GptqSettings(), *,
                 name: str = "weight", device: torch.device | str | None = None, overwrite: bool = False):
        if hessian.dim() != 2 or hessian.shape[0] != hessian.shape[1]:
            raise QwenTrayError(f"{name}: Hessian must be square, got {tuple(hessian.shape)}")
        if not all(bool(torch.isfinite(rows).all()) for rows in hessian.split(1024)):  # (whole: +1.6x its size)
            raise QwenTrayError(f"{name}: the calibration Hessian contains NaN or Inf")
        self.settings = settings
        self.device = torch.device(device) if device is not None else hessian.device
        h = hessian.to(self.device, torch.float32)
        self.k = h.shape[0]
        self.importance = h.diagonal().clamp(min=0.0)  # 2 E[x_k^2]: the clipping search's channel weights
        self.perm = torch.argsort(self.importance, descending=True, stable=True) if settings.act_order else None
        if self.perm is not None:
            if h is hessian and not overwrite:
                h = h.clone()  # the caller's tensor is not touched
            permute_symmetric_(h, self.perm)
        self.u = inverse_cholesky_upper(h, settings.damp, name, overwrite=overwrite or h is not hessian)

    @torch.inference_mode()
    def quantize_int(self, w: torch.Tensor, bits: int, *, name: str = "weight",
                     chunk_elements: int = GPTQ_CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
        """W [N, K] -> (q int8 [N, K], fp16 scales [N, K/group]) on ``w``'s device; ``w`` is not changed."""
        group = self.settings.group_size
        if group == GROUP_SIZE:
            n, k = check_weight(w, name)
        elif w.dim() != 2 or w.shape[1] % group:  # quality studies: narrower groups, K a multiple of them
            raise QwenTrayError(f"{name}: need a 2-D weight with K a multiple of {group}, got {tuple(w.shape)}")
        else:
            n, k = w.shape
        if k != self.k:
            raise QwenTrayError(f"{name}: weight K={k} does not match the Hessian's {self.k}")
        q_out = torch.empty((n, k), dtype=torch.int8, device=w.device)
        s_out = torch.empty((n, k // group), dtype=torch.float16, device=w.device)
        how = self.settings.scales
        for rows in row_chunks(n, k, chunk_elements):
            wf = w[rows].to(self.device, torch.float32, copy=True)  # the pass updates it in place
            if not bool(torch.isfinite(wf).all()):
                raise QwenTrayError(f"{name}: weight contains NaN or Inf")
            static = group_scales(wf, bits, self.importance, how, name, group) if self.settings.static else None
            q, s = _gptq_rows(wf, self.u, bits, self.importance, static, self.perm, how, name, group)
            q_out[rows], s_out[rows] = q.to(w.device), s.to(w.device)
        return q_out, s_out

    def quantize(self, w: torch.Tensor, bits: int, *, name: str = "weight") -> QuantizedTensor:
        """W [N, K] packed as ``w4`` / ``w3`` (the same tensors :func:`app.quant.search.quantize` makes)."""
        if bits not in FORMAT_OF_BITS:
            raise QwenTrayError(f"{name}: cannot quantize to {bits} bits (supported: 3, 4)")
        if self.settings.group_size != GROUP_SIZE:
            raise ValueError(f"the formats store groups of {GROUP_SIZE}; use quantize_int for other group sizes")
        q, scales = self.quantize_int(w, bits, name=name)
        if bits == 4:
            tensors = {"qweight": w4.pack_w4(q), "scales": scales}
        else:
            qlow, qhigh = w3.pack_w3(q)
            tensors = {"qlow": qlow, "qhigh": qhigh, "scales": scales}
        return QuantizedTensor(FORMAT_OF_BITS[bits], (w.shape[0], w.shape[1]), tensors, name=name)


def gptq_quantize(w: torch.Tensor, hessian: torch.Tensor, bits: int, *, name: str = "weight",
                  settings: GptqSettings = GptqSettings(),
                  device: torch.device | str | None = None) -> QuantizedTensor:
    """GPTQ of one weight W [N, K] given its inputs' Hessian [K, K] (see :class:`GptqSolver`)."""
    return GptqSolver(hessian, settings, name=name, device=device).quantize(w, bits, name=name)


def group_scales(wf: torch.Tensor, bits: int, importance: torch.Tensor, how: str, name: str,
                 group: int = GROUP_SIZE) -> torch.Tensor:
    """fp16 scales [R, K/group] of weights [R, K]: clipping search weighted by ``importance`` [K], or RTN.

    Groups narrower than 128 (quality studies only: the formats store 128) are zero-padded to
    128 columns each; padding changes neither the RTN maximum nor, with zero importance, the
    search's error.
    """
    r, k = wf.shape
    if group != GROUP_SIZE:
        pad = GROUP_SIZE - group
        wf = torch.nn.functional.pad(wf.reshape(r, k // group, group), (0, pad)).reshape(r, -1)
        importance = torch.nn.functional.pad(importance.reshape(k // group, group), (0, pad)).reshape(-1)
    if how == "search":
        return search_scales(wf, bits, name=name, importance=importance)
    return to_fp16_scales(rtn_scales_fp32(wf.reshape(r, -1, GROUP_SIZE), bits), name)


def _gptq_rows(wf: torch.Tensor, u: torch.Tensor, bits: int, importance: torch.Tensor,
               static: torch.Tensor | None, perm: torch.Tensor | None, how: str, name: str,
               group: int = GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """The column pass over one row chunk (``wf`` is consumed). Returns q [R, K] int8 and scales [R, K/group]."""
    qmin, qmax = qrange(bits)
    r, k = wf.shape
    scales = static if static is not None else torch.empty((r, k // group), dtype=torch.float16, device=wf.device)
    scales32 = scales.float()
    # Column j of the (possibly permuted) pass uses the scale of its original group.
    group_of = (perm if perm is not None else torch.arange(k, device=wf.device)) // group
    if perm is not None:
        wf = wf[:, perm]
    q = torch.empty((r, k), dtype=torch.int8, device=wf.device)
    for start in range(0, k, BLOCK):  # lazy updates: the rest of W is touched once per block
        stop = min(start + BLOCK, k)
        block = wf[:, start:stop]  # a view: updates land in wf
        err = torch.empty_like(block)
        u_block = u[start:stop, start:stop]
        for j in range(stop - start):
            col = start + j
            if static is None and col % group == 0:  # dynamic: the group's scale from its current weights
                scales[:, col // group] = group_scales(block[:, j:j + group], bits, importance[col:col + group],
                                                       how, name, group)[:, 0]
                scales32[:, col // group] = scales[:, col // group].float()
            s = scales32[:, group_of[col]]
            w_col = block[:, j]
            qj = torch.round(w_col / s).clamp_(qmin, qmax)
            q[:, col] = qj.to(torch.int8)
            e = (w_col - qj * s) / u_block[j, j]
            block[:, j:].sub_(e.unsqueeze(1) * u_block[j, j:].unsqueeze(0))
            err[:, j] = e
        if stop < k:
            wf[:, stop:].sub_(err @ u[start:stop, stop:])
    if perm is not None:
        q = q[:, torch.argsort(perm)]
    return q, scales
