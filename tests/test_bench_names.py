"""bench_decode's default result file follows the GPU, so a run on another card (a user's RTX 3050)
never overwrites the H200's published numbers."""

from __future__ import annotations

from benchmarks.bench_decode import default_out


def test_the_h200_keeps_its_file_names():
    assert default_out("NVIDIA H200", budget_only=False) == "docs/results/decode_h200.json"
    assert default_out("NVIDIA H200", budget_only=True) == "docs/results/decode_budget_h200.json"


def test_another_card_gets_its_own_file():
    assert (default_out("NVIDIA GeForce RTX 3050 Laptop GPU", budget_only=True)
            == "docs/results/decode_budget_rtx_3050_laptop_gpu.json")
