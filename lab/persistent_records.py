"""Where the persistent MLP probe's pieces are stored (docs/history/kernels/phase-21.md, docs/history/kernels/phase-22.md): the order
persistent_mlp.cu's warps take a layer's pieces in, and the records layouts built from it.

- `record_sources`: per (block, warp) the pieces in the order the kernel takes them;
- `stored_records` (layouts 1 and 2): every piece once more as a 1,056-byte record;
- `run_records` (layout 3): compact per-warp runs of lane records (1 KB of tiles, then each lane's
  two rows' scales as one word);
- `build_records`: what the probe passes the kernel for a layout.
"""

from __future__ import annotations

import torch

DEV = "cuda"
HIDDEN, INTER = 2048, 11008  # Qwen2.5-3B
WARPS = 16  # persistent_mlp.cu PM_WARPS


def step_index(seqs: dict, blocks: int) -> tuple[int, torch.Tensor]:
    """Per (block, warp) the pieces it takes, in order -> (steps J, index [J, blocks, WARPS] into
    a layer's pieces, -1 where a warp has fewer than J)."""
    steps = max(len(q) for q in seqs.values())
    index = torch.full((steps, blocks, WARPS), -1, dtype=torch.long)
    for (b, w), seq in seqs.items():
        index[: len(seq), b, w] = torch.tensor(seq, dtype=torch.long)
    return steps, index


def record_sources(blocks: int) -> tuple[int, torch.Tensor]:
    """The pieces in the order persistent_mlp.cu's PieceStream takes them (step_index). A
    layer's pieces: the gate/up tile-groups (tile * H/128 + group), then the down ones."""
    ga, gb, units, tiles_b = HIDDEN // 128, INTER // 128, INTER // 16, HIDDEN // 16
    seqs = {}
    for b in range(blocks):
        n_a = -(-(units - b) // blocks)
        dtile = (b + tiles_b) % blocks
        for w in range(WARPS):
            n_b = -(-(gb - w) // WARPS) if dtile < tiles_b else 0
            seq = [((j & 1) * units + b + (j >> 1) * blocks) * ga + w for j in range(2 * n_a)]
            seq += [2 * units * ga + dtile * gb + w + q * WARPS for q in range(n_b)]
            seqs[b, w] = seq
    return step_index(seqs, blocks)


def stored_records(mats: list[list[tuple[torch.Tensor, torch.Tensor]]], index: torch.Tensor) -> torch.Tensor:
    """Every piece once more as a 1,056-byte record (1 KB of tiles, 32 B of scales) at
    [layer][step][block][warp], so what all warps take at one step lies side by side. mats: per
    layer, its matrices in piece order as (tiles, tile-ordered scales)."""
    index = index.to(DEV)
    out = torch.empty(len(mats), *index.shape, 264, dtype=torch.int32, device=DEV)
    for ell, layer in enumerate(mats):
        rows = [torch.cat([t.reshape(-1, 256), s.view(torch.int32).reshape(-1, 8)], dim=1) for t, s in layer]
        pieces = torch.cat([*rows, torch.zeros(1, 264, dtype=torch.int32, device=DEV)])  # + the padding row
        out[ell] = pieces[index]  # -1 takes the padding row
    return out


def lane_pieces(tiles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A matrix's pieces as lane records [pieces, 288] int32: 1 KB of tiles, then for lane l the
    scales of rows g and g + 8 (g = l // 4) as one word (persistent_stream.cu, LANE_SCALES)."""
    s16 = scales.reshape(-1, 16)  # tile-ordered: [tiles][groups][16 rows] fp16
    g = torch.arange(32, device=s16.device) // 4
    pairs = torch.stack([s16[:, g], s16[:, g + 8]], dim=-1).contiguous().view(torch.int32).reshape(-1, 32)
    return torch.cat([tiles.reshape(-1, 256), pairs], dim=1)


def run_records(w: dict, blocks: int, pairs: bool, spare: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layout 3: every warp's pieces in the order it takes them, one compact run per (block, warp)
    over all stored layers (per layer a zero record after an odd count when a take holds two),
    then `spare` zero records for the rings' reads past the last run. -> (records, the record
    each run starts at [blocks * WARPS] int64)."""
    _, index = record_sources(blocks)
    layers, dev = len(w["gu"]), w["gu"][0].device
    tables = torch.stack([torch.cat([lane_pieces(w["gu"][ell], w["gu_st"][ell]),
                                     lane_pieces(w["dn"][ell], w["dn_st"][ell])]) for ell in range(layers)])
    zero = tables.shape[1]  # the zero row appended below
    tables = torch.cat([tables, torch.zeros(layers, 1, 288, dtype=torch.int32, device=dev)], dim=1)
    at_layer, at_piece, starts = [], [], []
    for b in range(blocks):
        for warp in range(WARPS):
            starts.append(len(at_piece))
            seq = [int(i) for i in index[:, b, warp] if i >= 0]
            if pairs and len(seq) % 2:
                seq.append(zero)
            for ell in range(layers):
                at_layer += [ell] * len(seq)
                at_piece += seq
    records = tables[torch.tensor(at_layer, device=dev), torch.tensor(at_piece, device=dev)]
    return (torch.cat([records, torch.zeros(spare, 288, dtype=torch.int32, device=dev)]),
            torch.tensor(starts, dtype=torch.int64, device=dev))


def run_start(b: int, warp: int, layers: int, blocks: int, pairs: bool) -> int:
    """Where run_records puts warp (b, warp)'s run, from the counts alone (the test's cross-check)."""
    units, tiles_b, groups_b = INTER // 16, HIDDEN // 16, INTER // 128
    start = 0
    for bb in range(b + 1):
        n_a, dt = -(-(units - bb) // blocks), (bb + tiles_b) % blocks
        for ww in range(warp if bb == b else WARPS):
            n_b = -(-(groups_b - ww) // WARPS) if dt < tiles_b else 0
            start += layers * (2 * n_a + n_b + (pairs and n_b % 2))
    return start


def build_records(w: dict, blocks: int, layout: int, pieces: int = 1) -> tuple:
    """(steps, records, the kernel's record_region, run offsets or None). Layout 1:
    [layer][step][block][warp] (region 0: unused); layout 2: [block][warp][layer][step], each
    warp's pieces one contiguous run of layers x steps records (a run over fewer layers reads the
    first ones); layout 3: run_records."""
    if layout == 3:
        records, starts = run_records(w, blocks, pieces == 2, spare=32)
        return 0, records, 0, starts
    steps, index = record_sources(blocks)
    mats = [[(w["gu"][ell], w["gu_st"][ell]), (w["dn"][ell], w["dn_st"][ell])] for ell in range(len(w["gu"]))]
    records = stored_records(mats, index)
    if layout == 1:
        return steps, records, 0, None
    return steps, records.permute(2, 3, 0, 1, 4).contiguous(), len(mats) * steps, None
