"""benchmarks/quality_control.dithered_folder: a source moved off a 4-bit grid, within each grid cell."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

from benchmarks.quality_control import dithered_folder


def test_dithering_spreads_each_layer_weight_over_its_q4_1_cell_and_nothing_else(tiny_qwen_dir, tmp_path):
    source = tmp_path / "grid"
    source.mkdir()
    weights = load_file(str(tiny_qwen_dir / "model.safetensors"))
    on_grid = {}
    for name, w in weights.items():  # put every layer weight on a Q4_1 grid, as S's are
        if ".layers." in name and w.dim() == 2:
            blocks = w.float().reshape(-1, 32)
            low, step = blocks.amin(1, keepdim=True), (blocks.amax(1, keepdim=True) - blocks.amin(1, keepdim=True)) / 15
            w = (low + torch.round((blocks - low) / step) * step).reshape(w.shape)
        on_grid[name] = w.contiguous()
    save_file(on_grid, str(source / "model.safetensors"))
    (source / "config.json").write_text((tiny_qwen_dir / "config.json").read_text())
    out = load_file(str(dithered_folder(source, tmp_path / "dithered", seed=0) / "model.safetensors"))
    for name, w in on_grid.items():
        if ".layers." in name and w.dim() == 2:
            blocks, moved = w.float().reshape(-1, 32), out[name].float().reshape(-1, 32)
            step = (blocks.amax(1, keepdim=True) - blocks.amin(1, keepdim=True)) / 15
            assert bool(((moved - blocks).abs() <= step / 2 + 1e-6).all()), name  # within its rounding cell
            assert len(torch.unique(moved[0])) == 32 and len(torch.unique(blocks[0])) <= 16  # off the grid
        else:
            assert torch.equal(out[name], w), name  # embedding, norms, biases untouched
