"""The persistent probes' records layouts (lab/persistent_records.py and
probe_persistent_layer.py, docs/history/kernels/phase-21.md, docs/history/kernels/phase-22.md): every piece of a layer is stored exactly
once, in the order the kernel's warps take them, whatever the SM count the grid has; each warp's
compact run starts where the kernel looks for it."""

from __future__ import annotations

import pytest
import torch

from lab.persistent_records import HIDDEN, INTER, WARPS, record_sources, run_records, run_start
from lab.probe_persistent_layer import NQKV, layer_record_sources

PIECES = 2 * (INTER // 16) * (HIDDEN // 128) + (HIDDEN // 16) * (INTER // 128)  # gate/up, then down


@pytest.mark.parametrize("sms", [128, 132, 140])
def test_every_piece_is_stored_once(sms):
    steps, index = record_sources(sms)
    assert index.shape == (steps, sms, WARPS)
    stored = index[index >= 0]
    assert stored.numel() == PIECES
    assert stored.unique().numel() == PIECES


def test_a_warp_takes_its_gate_and_up_pieces_first_then_its_down_pieces():
    _, index = record_sources(132)
    gate_up = 2 * (INTER // 16) * (HIDDEN // 128)
    # block 0 owns six units (688 over 132): twelve gate/up pieces of group `warp`, gate then up
    first = index[:12, 0, 3]
    assert (first < gate_up).all() and (first % (HIDDEN // 128) == 3).all()
    assert (first[1::2] - first[0::2] == (INTER // 16) * (HIDDEN // 128)).all()  # up tile = gate tile + I/16
    # block 0 has no down tile (132 - 128 blocks go without it); block 30 owns five units, then
    # down tile (30 + 128) % 132 = 26: groups 3, 19, ..., 83 of it
    assert (index[12:, 0, 3] == -1).all()
    down = index[10:, 30, 3]
    groups = INTER // 128
    assert down[:6].tolist() == [gate_up + 26 * groups + 3 + 16 * q for q in range(6)]
    assert (down[6:] == -1).all()


@pytest.mark.parametrize("sms", [128, 132, 160, 170])
def test_every_piece_of_a_whole_layer_is_stored_once(sms):
    pieces = (NQKV // 16 + HIDDEN // 16 + 2 * INTER // 16) * (HIDDEN // 128) + PIECES - 2 * (INTER // 16) * (HIDDEN // 128)
    steps, index = layer_record_sources(sms)
    stored = index[index >= 0]
    assert stored.numel() == pieces
    assert stored.unique().numel() == pieces
    # a warp takes its qkv pieces first: block 0, warp 5 -> qkv tiles 0 and `sms` (if any), group 5
    first = index[0, 0, 5]
    assert first == 5


def small_weights(layers: int) -> dict:
    """The 3B MLP's shapes with random words (only where the pieces land is checked)."""
    gen = torch.Generator().manual_seed(0)
    w = {}
    for key, tiles, groups in (("gu", 2 * INTER // 16, HIDDEN // 128), ("dn", HIDDEN // 16, INTER // 128)):
        w[key] = [torch.randint(-2**31, 2**31 - 1, (tiles, groups, 256), generator=gen, dtype=torch.int32)
                  for _ in range(layers)]
        w[key + "_st"] = [torch.rand(tiles, groups, 16, generator=gen).half() for _ in range(layers)]
    return w


@pytest.mark.parametrize("pairs", [False, True])
def test_run_records_put_each_warps_pieces_where_the_kernel_starts_its_run(pairs):
    layers, sms = 2, 132
    w = small_weights(layers)
    records, starts = run_records(w, sms, pairs, spare=4)
    _, index = record_sources(sms)
    gu_pieces = w["gu"][0].shape[0] * w["gu"][0].shape[1]
    total = run_start(sms - 1, WARPS - 1, layers, sms, pairs)
    last = [int(i) for i in index[:, sms - 1, WARPS - 1] if i >= 0]
    assert records.shape == (total + layers * (len(last) + (pairs and len(last) % 2)) + 4, 288)
    for b, warp in ((0, 0), (5, 7), (30, 3), (131, 15)):
        seq = [int(i) for i in index[:, b, warp] if i >= 0]
        per_layer = len(seq) + (pairs and len(seq) % 2)
        start = run_start(b, warp, layers, sms, pairs)
        assert int(starts[b * WARPS + warp]) == start
        for ell in range(layers):
            for j, piece in enumerate(seq):
                key, at = ("gu", piece) if piece < gu_pieces else ("dn", piece - gu_pieces)
                tiles = w[key][ell].reshape(-1, 256)[at]
                s16 = w[key + "_st"][ell].reshape(-1, 16)[at]
                row = records[start + ell * per_layer + j]
                assert torch.equal(row[:256], tiles)
                lane = 9  # g = 2: rows 2 and 10
                assert torch.equal(row[256 + lane : 257 + lane].view(torch.float16), s16[[2, 10]])
            if per_layer > len(seq):
                assert not records[start + ell * per_layer + len(seq)].any()  # the pad is zero
