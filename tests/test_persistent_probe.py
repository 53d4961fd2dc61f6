"""The persistent probes' records layouts (benchmarks/probe_persistent_mlp.py and
probe_persistent_layer.py, docs/KERNELS.md phase 21): every piece of a layer is stored exactly
once, in the order the kernel's warps take them, whatever the SM count the grid has."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from probe_persistent_layer import NQKV, layer_record_sources  # noqa: E402
from probe_persistent_mlp import HIDDEN, INTER, WARPS, record_sources  # noqa: E402

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
