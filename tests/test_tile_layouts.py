"""The GEMV's tile layouts (app.kernels.w4_tiles, w3_tiles) and the runtime's conversion (CPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from app.engine.cuda.layout import kernel_layout_extra_bytes, to_kernel_layout
from app.engine.cuda.synthetic import dequantized_linear, quantize_linear
from app.engine.cuda.weights import DequantTables, LayerWeights, LinearWeight, ModelWeights, lookup_rows
from app.formats.spec import ModelSpec
from app.formats.w3 import pack_w3
from app.formats.w4 import pack_w4
from app.kernels import tiles
from app.kernels.w3_tiles import repack_w3_tiles, repack_w3_tiles_, tile_values, unpack_w3_tiles
from app.kernels.w4_tiles import repack_w4_tiles, repack_w4_tiles_, tile_words, unpack_w4_tiles


def random_q(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(-4, 4, (n, k), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n,k", [(16, 128), (48, 384), (160, 1152)])
def test_repack_round_trips_and_reads_any_row(n, k):
    q = random_q(n, k, seed=n)
    qlow, qhigh = pack_w3(q)
    a, b = repack_w3_tiles(qlow, qhigh)
    assert a.shape == qlow.shape and b.shape == qhigh.shape  # same bytes
    assert not torch.equal(a, qlow)  # really another layout
    back = unpack_w3_tiles(a, b)
    assert torch.equal(back[0], qlow) and torch.equal(back[1], qhigh)
    rows = torch.tensor([n - 1, 0, 17 % n, 8, 8])
    assert torch.equal(tile_values(a, b, rows).long() - 4, q[rows])


def test_bit_positions_follow_the_diagram():
    u = torch.zeros(16, 128, dtype=torch.long)
    u[0, 0] = 7  # row 0 (lane 0, h 0), pair 0 even: bits 0-2 of W0 = a[0]
    u[0, 9] = 5  # pair 4 odd: bits 16 + 12..14 of W0
    u[0, 31] = 0b110  # pair 15 odd: sign bits of W1 and W2 (b), high half
    u[8, 2] = 2  # row 8 (h 1), pair 1 even: bits 3-5 of its W0 = a[2]
    u[3, 32 + 20] = 3  # row 3 -> lane 4*3 + 1 (t = 1), pair 10 even: bits 0-2 of W2 = b[2 * 13]
    a, b = repack_w3_tiles(*pack_w3(u - 4))
    a, b = a.view(-1).long() & 0xFFFFFFFF, b.view(-1).long() & 0xFFFFFFFF
    assert a[0] == 7 | (5 << 28) and a[1] == 1 << 31 and b[0] == 1 << 31
    assert a[2] == 2 << 3
    assert b[2 * 13] == 3
    assert int(a.count_nonzero()) == 3 and int(b.count_nonzero()) == 2


def test_in_place_repack_in_chunks_equals_copy(monkeypatch):
    monkeypatch.setattr(tiles, "REPACK_CHUNK_ELEMENTS", 16 * 256)  # several chunks
    qlow, qhigh = pack_w3(random_q(80, 256, seed=3))
    want = repack_w3_tiles(qlow, qhigh)
    repack_w3_tiles_(qlow, qhigh)
    assert torch.equal(qlow, want[0]) and torch.equal(qhigh, want[1])


def test_rows_past_a_whole_tile_are_padded():
    q = random_q(40, 128, seed=1)
    a, b = repack_w3_tiles(*pack_w3(q))
    assert a.shape == (48, 8) and b.shape == (48, 4)
    back = unpack_w3_tiles(a, b, 40)
    assert torch.equal(back[0], pack_w3(q)[0]) and torch.equal(back[1], pack_w3(q)[1])
    assert torch.equal(tile_values(a, b, torch.arange(40, 48)), torch.zeros(8, 128, dtype=torch.uint8))
    with pytest.raises(ValueError, match="N % 16 == 0"):  # in place needs whole tiles
        repack_w3_tiles_(*pack_w3(q))


# -- W4 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", [(16, 128), (48, 384), (40, 256)])
def test_w4_repack_moves_words_only_and_round_trips(n, k):
    qweight = pack_w4(random_q(n, k, seed=k) * 2)  # [-8, 6]
    tiles = repack_w4_tiles(qweight)
    assert tiles.shape == (-(-n // 16) * 16, k // 8)
    assert torch.equal(unpack_w4_tiles(tiles, n), qweight)
    rows = torch.tensor([n - 1, 3, 8, 0])
    assert torch.equal(tile_words(tiles, rows), qweight[rows])
    # row 8 + g = 9 (h 1, g 1), lane 4*1 + t: t = 2 holds words 8..11 of group 0
    assert torch.equal(tiles.view(-1, 2, 32, 4)[0, 1, 4 * 1 + 2], qweight[9, 8:12])


def test_w4_in_place_repack_in_chunks_equals_copy(monkeypatch):
    monkeypatch.setattr(tiles, "REPACK_CHUNK_ELEMENTS", 16 * 256)
    qweight = pack_w4(random_q(64, 512, seed=9))
    want = repack_w4_tiles(qweight)
    repack_w4_tiles_(qweight)
    assert torch.equal(qweight, want)


def _linear(n: int, k: int, bits: int, seed: int, name: str) -> LinearWeight:
    g = torch.Generator().manual_seed(seed)
    dense = LinearWeight(16, n, k, dense=(torch.randn(n, k, generator=g) * 0.05).half(), name=name)
    return quantize_linear(dense, bits)


def _model(vocab: int, inter: int, gate_up_rows: int | None = None) -> ModelWeights:
    spec = ModelSpec.from_hf_config(dict(architectures=["LlamaForCausalLM"], vocab_size=vocab, hidden_size=128,
                                         intermediate_size=inter, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, tie_word_embeddings=True))
    layer = LayerWeights(torch.ones(128).half(), torch.ones(128).half(), _linear(256, 128, 4, 1, "qkv"),
                         _linear(128, 128, 3, 2, "o"), _linear(gate_up_rows or 2 * inter, 128, 3, 3, "gate_up"),
                         _linear(128, inter, 3, 4, "down"))
    embed = _linear(vocab, 128, 3, 5, "embed")
    return ModelWeights(spec, embed, [layer], torch.ones(128).half(), embed)


def test_runtime_conversion_keeps_values_and_tied_embedding():
    weights = _model(vocab=1024, inter=256)
    want = {name: dequantized_linear(w) for name, w in (("o", weights.layers[0].o), ("head", weights.lm_head))}
    want["qkv"] = dequantized_linear(weights.layers[0].qkv)
    before = weights.layers[0].o.qa.clone()
    tiled = to_kernel_layout(weights, in_place=False)
    assert torch.equal(weights.layers[0].o.qa, before)  # a copy: the caller's tensors are untouched
    layer = tiled.layers[0]
    assert [w.layout for w in (layer.qkv, layer.o, layer.gate_up, layer.down, tiled.lm_head)] == ["tiles"] * 5
    assert tiled.embed is tiled.lm_head  # still tied
    assert torch.equal(dequantized_linear(layer.o), want["o"])
    assert torch.equal(dequantized_linear(layer.qkv), want["qkv"])  # W4
    ids = torch.tensor([1023, 0, 17], dtype=torch.int32)
    out = torch.full((3, 128), float("nan"), dtype=torch.float16)
    assert torch.equal(lookup_rows(tiled.embed, ids, DequantTables("cpu"), out), want["head"][ids.long()].half())
    assert to_kernel_layout(tiled, in_place=True).lm_head is tiled.lm_head  # converting twice is a no-op


@pytest.mark.parametrize("vocab,bits", [(1024, 3), (512, 4), (1000, 4)])
def test_an_untied_embedding_is_repacked_in_place_where_no_copy_is_needed(vocab, bits):
    weights = _model(vocab=vocab, inter=256)
    embed = _linear(vocab, 128, bits, 6, "embed")
    weights = ModelWeights(weights.spec, embed, weights.layers, weights.final_norm, weights.lm_head)
    want = dequantized_linear(embed).half()
    ids = torch.tensor([vocab - 1, 0, 17, 17], dtype=torch.int32)
    tiled = to_kernel_layout(weights, in_place=True)
    # a vocabulary of whole 16-row tiles is repacked in its own tensors; 1,000 rows would need a copy
    assert tiled.embed.layout == ("rows" if vocab % 16 else "tiles")
    assert tiled.embed.qa is embed.qa or tiled.embed is embed
    out = torch.full((4, 128), float("nan"), dtype=torch.float16)
    assert torch.equal(lookup_rows(tiled.embed, ids, DequantTables("cpu"), out), want[ids.long()])
    assert to_kernel_layout(_model(vocab=1024, inter=256), in_place=False).embed.layout == "tiles"  # tied: the head's


def test_runtime_conversion_pads_a_partial_tile_and_runs_odd_gate_up_dense():
    weights = _model(vocab=1000, inter=256, gate_up_rows=2 * 264)  # 1000 and 264 are not multiples of 16
    want_head, want_gate_up = dequantized_linear(weights.lm_head), dequantized_linear(weights.layers[0].gate_up)
    extra = kernel_layout_extra_bytes(weights)
    tiled = to_kernel_layout(weights, in_place=True)
    head = tiled.lm_head
    assert head.layout == "tiles" and head.qa.shape[0] == 1008 and head.qa is not weights.lm_head.qa
    assert torch.equal(dequantized_linear(head), want_head)
    gate_up = tiled.layers[0].gate_up
    assert gate_up.bits == 16 and torch.equal(gate_up.dense, want_gate_up.half())
    assert tiled.layers[0].down.layout == "tiles" and tiled.layers[0].down.qa is weights.layers[0].down.qa
    padded = head.qa.numel() * 4 + head.qb.numel() * 4
    assert padded + gate_up.dense.numel() * 2 <= extra < padded + gate_up.dense.numel() * 2 + 3 * 256


def test_tiles_layout_needs_packed_weights_and_padded_tensors():
    w = _linear(40, 128, 3, 6, "w")
    with pytest.raises(Exception, match=r"qa: expected .*\(48, 8\)"):
        replace(w, layout="tiles")  # unpadded tensors
    with pytest.raises(Exception, match="layout 'tiles'"):
        LinearWeight(16, 16, 128, dense=torch.zeros(16, 128).half(), layout="tiles")
