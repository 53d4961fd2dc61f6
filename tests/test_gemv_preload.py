"""Preloaded GEMV weights (app.kernels.gemv_preload, gemv.cu PRELOAD): the plan on the CPU; on
a GPU the preloading launch against the register path with the same split, bit for bit."""

from __future__ import annotations

import pytest
import torch

from app.kernels import gemv_preload
from app.kernels.gemv import GemvConfig, most_staged_x_bytes, preload_plan

H200_SMS = 132


def resident_like_h200(warps: int, bound: int, shared: int) -> int:
    """Blocks per SM as the occupancy calculator gives them for the gemv kernel on an H200:
    ~60 registers a thread (64 x 32 x warps of the 64K file), 228 KB of shared memory with
    1 KB reserved per block, at most 64 warps."""
    by_registers = 65536 // (64 * 32 * warps)
    by_shared = (228 << 10) // (shared + 1024)
    return min(by_registers, by_shared, 64 // warps)


def test_group_bounds():
    assert [gemv_preload.group_bound(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [2, 2, 4, 4, 8, 8, None]


def test_the_3b_gate_up_preloads_with_fewer_warps_so_the_grid_fits_one_wave():
    # 688 blocks: 8 warps (4 groups each) leave 4 blocks per SM (528 resident); 4 warps walk
    # 8 groups each, 32 KB of copies + 4 KB of x, 6 blocks per SM (792).
    plan = gemv_preload.plan(11008, 2048, True, 4, 8, H200_SMS, most_staged_x_bytes(2048), resident_like_h200)
    assert plan == gemv_preload.PreloadPlan(warps=4, groups=8, weight_bytes=32 << 10)


def test_one_group_per_warp_or_a_many_wave_grid_does_not_preload():
    # the 3B qkv: 160 blocks of 16 warps, one group of 128 each -> halving gives 2 groups per warp
    qkv = gemv_preload.plan(2560, 2048, False, 4, 16, H200_SMS, 4096, resident_like_h200)
    assert qkv is not None and qkv.warps == 8 and qkv.groups == 2
    # the 3B head: 9,496 blocks can never be resident at once
    assert gemv_preload.plan(151936, 2048, False, 4, 4, H200_SMS, 4096, resident_like_h200) is None
    # the 7B gate/up (W3): 1,184 blocks; more than 8 groups per warp before it would fit
    assert gemv_preload.plan(18944, 3584, True, 3, 8, H200_SMS, 7168, resident_like_h200) is None
    # a GPU whose calculator says nothing fits
    assert gemv_preload.plan(96, 1152, True, 4, 16, H200_SMS, 0, lambda *_: 0) is None


def test_w3_copies_take_three_quarters_of_the_w4_bytes():
    plan = gemv_preload.plan(2048, 11008, False, 3, 32, H200_SMS, 0, resident_like_h200)
    assert plan is not None and plan.weight_bytes == plan.warps * -(-86 // plan.warps) * 768


def test_most_staged_x_covers_every_batch_and_the_fused_norm():
    assert most_staged_x_bytes(2048) == 4096  # batch 1 (and the fused norm)
    assert most_staged_x_bytes(1024) == 4096  # batch 2
    assert most_staged_x_bytes(3584) == 7168  # the 7B's fused norm stages 7 KB
    assert most_staged_x_bytes(11008) == 0  # never staged


# --- on the GPU -------------------------------------------------------------------------------

# (N out, K) of gated GEMVs: the 3B MLP, Qwen2.5-0.5B's (K = 7 groups), odd small ones
GATED_SHAPES = [(11008, 2048), (4864, 896), (528, 1152), (48, 1152)]


def test_only_the_gated_gemv_preloads():
    # decided before any GPU is asked: the other GEMVs follow DRAM-bound kernels or walk one group
    assert preload_plan(4, 2048, 11008, False, torch.device("cuda")) is None
    assert preload_plan(4, 2560, 2048, False, torch.device("cuda")) is None
    assert preload_plan(4, 11008, 2048, True, torch.device("cpu")) is None


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("n,k", GATED_SHAPES)
def test_preloaded_launch_equals_the_register_path(bits, n, k):
    from app.kernels import loader
    from tests.test_kernels_gpu import GATED, REL_TOL, activations, poisoned, rel_err, weights

    if not loader.programmatic_launches():
        pytest.skip("no programmatic launches on this GPU: nothing is preloaded")
    plan = preload_plan(bits, n, k, True, torch.device("cuda"))
    assert plan is not None  # every one of these grids fits one wave on a GPU with PDL (SM90+)
    op, reference = GATED[bits]
    w = weights(bits, 2 * n, k, seed=n + k)
    same_split = GemvConfig(tiles=1, warps=plan.warps, unroll=1)
    for m in (1, 3, 8, 12):  # 12: two column blocks, no copies, the plan's split
        x = activations(m, k, seed=m)
        preloaded = op(x, *w, out=poisoned(m, n))
        registers = op(x, *w, out=poisoned(m, n), config=same_split)
        assert torch.equal(preloaded, registers), m
        assert rel_err(preloaded, reference(x, *w)) < REL_TOL, m
