"""CPU tests of the kernel layer: references vs naive implementations, the GEMV's lane/mma
mapping emulated bit by bit in numpy, and the launchers' argument checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from app.engine.layers import RMSNorm, apply_rope, causal_gqa_attention
from app.formats.w3 import pack_w3
from app.formats.w4 import pack_w4
from app.kernels import reference as ref
from app.kernels.attention import MIN_CHUNK, default_num_splits
from app.kernels.checks import check_tensor, no_overlap
from app.kernels.gemv import GemvConfig, default_gemv_config
from app.kernels.loader import KERNEL_DIR, KernelArgumentError, KernelUnavailableError, kernel_source

PERM4 = [0, 2, 4, 6, 1, 3, 5, 7]


def _rand_q(n, k, lo, hi, seed):
    return torch.randint(lo, hi + 1, (n, k), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


def _scales(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, k // 128, generator=g) * 0.02 + 0.005).half()


# -- the layouts, decoded naively from the brief's words ---------------------------------------
def naive_unpack_w4(qweight: np.ndarray) -> np.ndarray:
    n, words = qweight.shape
    q = np.zeros((n, words * 8), np.int64)
    for r in range(n):
        for j in range(words):
            w = int(qweight[r, j]) & 0xFFFFFFFF
            for i in range(8):
                q[r, 8 * j + PERM4[i]] = ((w >> (4 * i)) & 0xF) - 8
    return q


def naive_unpack_w3(qlow: np.ndarray, qhigh: np.ndarray) -> np.ndarray:
    n = qlow.shape[0]
    k = qlow.shape[1] * 16
    q = np.zeros((n, k), np.int64)
    for r in range(n):
        for kk in range(k):
            lo_word = int(qlow[r, kk // 16]) & 0xFFFFFFFF
            hi_word = int(qhigh[r, kk // 32]) & 0xFFFFFFFF
            i, odd = (kk % 16) // 2, kk % 2
            low = (lo_word >> (2 * i + 16 * odd)) & 3
            j = (kk % 32) // 2
            high = (hi_word >> (j + 16 * odd)) & 1
            q[r, kk] = (low | (high << 2)) - 4
    return q


@pytest.mark.parametrize("n,k", [(3, 128), (37, 256)])
def test_w4_reference_decodes_the_documented_layout(n, k):
    q = _rand_q(n, k, -8, 7, 1)
    qweight, scales = pack_w4(q), _scales(n, k, 2)
    assert np.array_equal(naive_unpack_w4(qweight.numpy()), q.numpy())
    x = torch.randn(2, k).half()
    w = torch.from_numpy(naive_unpack_w4(qweight.numpy())).double() * scales.double().repeat_interleave(128, 1)
    want = (x.double() @ w.T).half()
    got = ref.gemv_w4_ref(x, qweight, scales)
    assert (got.float() - want.float()).abs().max() <= 2e-3 * want.float().abs().max()


@pytest.mark.parametrize("n,k", [(3, 128), (21, 384)])
def test_w3_reference_decodes_the_documented_layout(n, k):
    q = _rand_q(n, k, -4, 3, 3)
    qlow, qhigh = pack_w3(q)
    assert np.array_equal(naive_unpack_w3(qlow.numpy(), qhigh.numpy()), q.numpy())
    scales = _scales(n, k, 4)
    x = torch.randn(3, k).half()
    w = q.double() * scales.double().repeat_interleave(128, 1)
    want = (x.double() @ w.T).half()
    got = ref.gemv_w3_ref(x, qlow, qhigh, scales)
    assert (got.float() - want.float()).abs().max() <= 2e-3 * want.float().abs().max()


# -- the GEMV kernel's data path, emulated lane by lane --------------------------------------
def _half2(bits: int) -> tuple[float, float]:
    pair = np.array([bits & 0xFFFF, bits >> 16], dtype=np.uint16).view(np.float16)
    return float(pair[0]), float(pair[1])


def _dequant_pair_w4(words, p):
    w = int(words[p >> 2]) & 0xFFFFFFFF
    u = ((w >> (4 * (p & 3))) & 0x000F000F) | 0x64006400
    a, b = _half2(u)
    return a - 1032.0, b - 1032.0  # hsub2 with 0x6408 (exact for these integers)


def _dequant_pair_w3(frag, p):
    lo_words, hi = frag
    lo = int(lo_words[0] if p < 8 else lo_words[1]) & 0xFFFFFFFF
    hi = int(hi) & 0xFFFFFFFF
    u = ((lo >> (2 * (p & 7))) & 0x00030003) | (((hi >> p) & 0x00010001) << 2) | 0x64006400
    a, b = _half2(u)
    return a - 1028.0, b - 1028.0


def emulate_gemv(x, bits, qa, qb, scales, n):
    """What gemv.cu computes, with each lane's fragments placed in mma.m16n8k16 slots."""
    m, k = x.shape
    xs = x.numpy().astype(np.float64)
    y = np.zeros((m, n))
    for base in range(0, n, 16):
        rows = [min(base + r, n - 1) for r in range(16)]
        ok = np.array([base + r < n for r in range(16)])
        acc = np.zeros((16, 8))
        for grp in range(k // 128):
            frags = {}
            for r in range(16):
                row = rows[r]
                for t in range(4):
                    if bits == 4:
                        frags[r, t] = qa[row, grp * 16 + 4 * t: grp * 16 + 4 * t + 4]
                    else:
                        frags[r, t] = (qa[row, grp * 8 + 2 * t: grp * 8 + 2 * t + 2], qb[row, grp * 4 + t])
            dq = _dequant_pair_w4 if bits == 4 else _dequant_pair_w3
            c = np.zeros((16, 8))
            for s in range(8):
                a_mat, b_mat = np.zeros((16, 16)), np.zeros((16, 8))
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    p0, p1 = 2 * s, 2 * s + 1
                    a_mat[g, 2 * t: 2 * t + 2] = dq(frags[g, t], p0)
                    a_mat[g + 8, 2 * t: 2 * t + 2] = dq(frags[g + 8, t], p0)
                    a_mat[g, 2 * t + 8: 2 * t + 10] = dq(frags[g, t], p1)
                    a_mat[g + 8, 2 * t + 8: 2 * t + 10] = dq(frags[g + 8, t], p1)
                    if g < m:
                        xk = grp * 128 + 32 * t
                        b_mat[2 * t: 2 * t + 2, g] = xs[g, xk + 2 * p0: xk + 2 * p0 + 2]
                        b_mat[2 * t + 8: 2 * t + 10, g] = xs[g, xk + 2 * p1: xk + 2 * p1 + 2]
                c += a_mat @ b_mat
            sc = np.array([float(scales[rows[r], grp]) if ok[r] else 0.0 for r in range(16)])
            acc += sc[:, None] * c
        for r in range(16):
            if ok[r]:
                y[:, base + r] = acc[r, :m]
    return y


@pytest.mark.parametrize("bits,n,m", [(4, 19, 1), (4, 32, 3), (3, 21, 8), (3, 16, 2)])
def test_emulated_gemv_lane_mapping_computes_x_times_w(bits, n, m):
    k = 256
    q = _rand_q(n, k, -8, 7, 5) if bits == 4 else _rand_q(n, k, -4, 3, 5)
    scales = _scales(n, k, 6)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).half()
    if bits == 4:
        qa, qb = pack_w4(q).numpy(), None
    else:
        lo, hi = pack_w3(q)
        qa, qb = lo.numpy(), hi.numpy()
    got = emulate_gemv(x, bits, qa, qb, scales.numpy(), n)
    w = q.double() * scales.double().repeat_interleave(128, 1)
    want = (x.double() @ w.T).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# -- epilogues, norm, rope, attention ---------------------------------------------------------
def test_linear_ref_rounds_like_the_unfused_path():
    torch.manual_seed(0)
    x, w = torch.randn(3, 256).half(), torch.randn(40, 256) * 0.05
    bias, res = torch.randn(40).half(), torch.randn(3, 40).half()
    y16 = (x.double() @ w.double().T + bias.double()).half()
    want = (y16.float() + res.float()).half()
    assert torch.equal(ref.linear_ref(x, w, bias, res), want)


def test_gate_up_silu_ref_matches_naive_float64():
    torch.manual_seed(1)
    x, w = torch.randn(4, 128).half(), torch.randn(2 * 24, 128) * 0.1
    gu = (x.double() @ w.double().T)
    gate, up = gu[:, :24], gu[:, 24:]
    want = gate * torch.sigmoid(gate) * up
    got = ref.gate_up_silu_ref(x, w).double()
    assert ((got - want).abs() <= 3e-3 * want.abs() + 1e-3).all()


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_ref_is_bitwise_the_engine_rmsnorm(with_residual):
    torch.manual_seed(2)
    x, res = torch.randn(5, 96).half() * 3, torch.randn(5, 96).half()
    norm = RMSNorm(96, 1e-6).half()
    norm.weight.data = (torch.rand(96) + 0.5).half()
    if with_residual:
        y, h = ref.rms_norm_ref(x, norm.weight.data, 1e-6, residual=res)
        assert torch.equal(h, x + res)
        assert torch.equal(y, norm(x + res))
    else:
        assert torch.equal(ref.rms_norm_ref(x, norm.weight.data, 1e-6), norm(x))


def test_rope_kv_write_ref_matches_engine_rope_and_writes_only_its_rows():
    torch.manual_seed(3)
    hq, hkv, d, tokens = 4, 2, 16, 3
    freqs = torch.outer(torch.arange(50).float(), 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()  # [P, D]
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d).half()
    positions, slots = torch.tensor([7, 0, 49], dtype=torch.int32), torch.tensor([1, 0, 1], dtype=torch.int32)
    kc, vc = torch.zeros(2, hkv, 50, d).half(), torch.zeros(2, hkv, 50, d).half()
    q = ref.rope_kv_write_ref(qkv, cos, sin, positions, slots, kc, vc, num_q_heads=hq, num_kv_heads=hkv)
    qs, ks, vs = qkv.view(tokens, -1, d).split([hq, hkv, hkv], dim=1)
    pc, ps = cos[positions.long()], sin[positions.long()]
    torch.testing.assert_close(q.float(), apply_rope(qs, pc, ps).half().float(), atol=2e-3, rtol=0)
    k_want = apply_rope(ks, pc, ps).half()
    for i, (p, s) in enumerate(zip(positions.tolist(), slots.tolist())):
        torch.testing.assert_close(kc[s, :, p].float(), k_want[i].float(), atol=2e-3, rtol=0)
        assert torch.equal(vc[s, :, p], vs[i])
    assert int((kc != 0).any(-1).sum()) == tokens * hkv  # nothing else written


def test_decode_attention_ref_matches_engine_attention():
    torch.manual_seed(4)
    hq, hkv, d, max_len = 6, 2, 32, 40
    kc, vc = torch.randn(3, hkv, max_len, d).half(), torch.randn(3, hkv, max_len, d).half()
    q = torch.randn(2, hq, d).half()
    lens, slots = torch.tensor([1, 33], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32)
    got = ref.decode_attention_ref(q, kc, vc, lens, slots)
    for b in range(2):
        n, s = int(lens[b]), int(slots[b])
        want = causal_gqa_attention(q[b:b + 1], kc[s, :, :n], vc[s, :, :n], start=n - 1).view(hq, d)
        torch.testing.assert_close(got[b].float(), want.float(), atol=2e-3, rtol=0)
    assert torch.equal(ref.decode_attention_ref(q, kc, vc, torch.tensor([0, 5], dtype=torch.int32), slots)[0],
                       torch.zeros(hq, d).half())


# -- configuration and argument checks --------------------------------------------------------
def test_gemv_config_validates_and_names_instances():
    assert GemvConfig(2, 8, 2).name_expression(4, False) == "gemv_kernel<4, 2, false, 2, 1, 512, false>"
    assert GemvConfig(2, 4, 1).grid(100, gated=True) == (7,)  # 16 outputs per block
    for bad in (dict(tiles=3), dict(warps=0), dict(warps=17), dict(warps=24), dict(unroll=3),
                dict(tiles=4, unroll=2), dict(tiles=2, warps=32), dict(warps=32, unroll=2)):
        with pytest.raises(KernelArgumentError):
            GemvConfig(**bad)
    with pytest.raises(KernelArgumentError):
        GemvConfig(tiles=1, warps=3).grid(64, gated=True)  # split gate/up needs an even number of warps
    assert GemvConfig(tiles=1, warps=2).grid(100, gated=True) == (7,)
    assert GemvConfig(tiles=1, warps=2).name_expression(3, True, 2) == "gemv_kernel<3, 1, true, 1, 2, 512, false>"


def test_a_32_slice_split_takes_1024_threads_or_two_slices_per_warp():
    """One column block: 32 warps of 64 registers; rows 9..16 need more registers, so the same
    32 slices (the same summation order) run two per warp on 16 warps."""
    wide = GemvConfig(tiles=1, warps=32)
    assert (wide.block_warps(1), wide.name_expression(4, False, 1)) == (32, "gemv_kernel<4, 1, false, 1, 1, 1024, false>")
    assert (wide.block_warps(2), wide.name_expression(3, False, 2)) == (16, "gemv_kernel<3, 1, false, 1, 2, 512, false>")
    assert GemvConfig(tiles=1, warps=16).block_warps(2) == 16


@pytest.mark.parametrize("n,k,gated,sms", [(2048, 2048, False, 16), (2048, 2048, False, 132),
                                           (11008, 2048, True, 132), (3584, 18944, False, 132), (256, 128, False, 8)])
def test_default_gemv_config_is_valid(n, k, gated, sms):
    cfg = default_gemv_config(n, k, gated, sms)
    assert cfg.warps <= max(1, k // 128) and cfg.grid(n, gated)[0] >= 1 and cfg.unroll == 1
    assert cfg.out_rows_per_block(gated) * cfg.grid(n, gated)[0] >= n


def test_default_gemv_config_follows_the_h200_sweep():
    """kernels_h200.json (c2bbf22): the defaults the sweep found best for the Qwen2.5 shapes."""
    sms = 132
    assert default_gemv_config(11008, 2048, True, sms).warps == 8  # 3B gate/up: 4 left 21 warps per SM, 6 % slower
    assert default_gemv_config(18944, 3584, True, sms).warps == 8  # 7B gate/up: 4 was 10 % slower
    assert default_gemv_config(151936, 2048, False, sms).warps == 4  # 3B lm_head
    assert default_gemv_config(152064, 3584, False, sms).warps == 4  # 7B lm_head
    assert default_gemv_config(2560, 2048, False, sms).warps == 16  # 3B qkv
    assert default_gemv_config(3584, 18944, False, sms).warps == 16  # 7B down: 224 blocks, more than the SMs
    assert default_gemv_config(2048, 11008, False, sms).warps == 32  # 3B down: a block per SM, 86 groups


def test_default_gemv_config_follows_the_3050_proxy_sweep():
    """proxy_3050_sweep_h200.json (ae44534, 16 SMs of the H200 trimmed to a GA10x SM): a grid of
    many waves splits K over fewer warps than the H200's one-wave grids."""
    sms = 16
    assert default_gemv_config(2048, 11008, False, sms).warps == 8  # 3B down: 8 blocks per SM; 16 warps 1.51x slower
    assert default_gemv_config(3584, 18944, False, sms).warps == 4  # 7B down: 16 warps 1.59x slower
    assert default_gemv_config(18944, 3584, True, sms).warps == 4  # 7B gate/up: 8 warps 1.20x slower
    assert default_gemv_config(11008, 2048, True, sms).warps == 4  # 3B gate/up: 43 blocks per SM, enough warps
    assert default_gemv_config(151936, 2048, False, sms).warps == 4  # 3B lm_head


def test_default_num_splits_bounds():
    assert default_num_splits(2, 4096, 16) == 16
    assert default_num_splits(4, 100, 132) == math.ceil(100 / MIN_CHUNK)
    assert 1 <= default_num_splits(8, 1_000_000, 1000) <= 256


def test_check_tensor_messages_name_the_argument():
    with pytest.raises(KernelArgumentError, match="x: dtype must be torch.float16"):
        check_tensor("x", torch.zeros(2, 3), torch.float16, (None, 3))
    with pytest.raises(KernelArgumentError, match=r"scales: shape must be \[4, \*\]"):
        check_tensor("scales", torch.zeros(3, 2).half(), torch.float16, (4, None))
    with pytest.raises(KernelArgumentError, match="must be on a CUDA device"):
        check_tensor("x", torch.zeros(2, 3).half(), torch.float16, (2, 3))
    buf = torch.zeros(10)
    with pytest.raises(KernelArgumentError, match="must not overlap"):
        no_overlap("a", buf[:6], "b", buf[4:])
    no_overlap("a", buf[:5], "b", buf[5:])


def test_ops_without_gpu_explain_why():
    from app.kernels import available, gemv_w4, unavailable_reason

    if available():
        pytest.skip("a GPU is present")
    assert unavailable_reason()
    with pytest.raises(KernelUnavailableError, match="CUDA kernels unavailable"):
        gemv_w4(torch.zeros(1, 128).half(), torch.zeros(4, 16, dtype=torch.int32), torch.zeros(4, 1).half())


def test_kernel_sources_are_packaged_and_prefixed_with_common():
    files = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    assert files == ["argmax.cu", "attention.cu", "common.cu", "dequant.cu", "draw_common.cu",
                     "filtered_draw.cu", "gemv.cu", "norm.cu", "repack.cu", "rope.cu", "temperature_draw.cu"]
    src = kernel_source("gemv.cu")
    assert src.index("mma_m16n8k16(float") < src.index("gemv_kernel(")
    assert "#include" not in src  # NVRTC from pip must not need CUDA headers
