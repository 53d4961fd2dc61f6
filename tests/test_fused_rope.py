"""RoPE + KV write fused into the decode attention's split kernel (docs/KERNELS.md § Fused RoPE and KV write):
the kernel bit-equal to rope_kv_write followed by decode_attention (GPU), and the decode step
and the graph prefill with and without the fusion (CPU wiring, GPU bits)."""

from __future__ import annotations

import pytest
import torch

# -- the decode step and the graph prefill (CPU wiring, GPU bits) -------------------------------


def run_model(fuse: bool, device: str, prefill_mode: str, arch: str) -> tuple[list, torch.Tensor]:
    """Prefill a 21-token prompt (through the decode graph's rows in "graph" mode), then decode
    two sequences side by side; the logits and the KV cache."""
    from test_cuda_runtime import random_model, runtime_weights, tiny_spec

    from app.engine.cuda.runner import CudaRunner
    from app.engine.runner import RunnerOptions

    weights = runtime_weights(random_model(tiny_spec(arch), seed=21), "w4").map_tensors(lambda t: t.to(device))
    runner = CudaRunner(weights, num_slots=3, max_context=64, prefill_mode=prefill_mode,
                        options=RunnerOptions(fuse_rope=fuse))
    prompt = torch.randint(3, 1000, (21,), generator=torch.Generator().manual_seed(5)).tolist()
    logits = [runner.prefill(2, prompt, 0).cpu(), runner.prefill(0, prompt[:9], 0).cpu()]
    tokens, positions = [int(logits[0].argmax()), int(logits[1].argmax())], [21, 9]
    for _ in range(5):
        step = runner.decode([2, 0], tokens, positions)
        logits.append(step.cpu())
        tokens, positions = step.argmax(-1).tolist(), [p + 1 for p in positions]
    return logits, torch.stack([runner.cache.k.cpu(), runner.cache.v.cpu()])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("prefill_mode,arch", [("graph", "qwen2"), ("gemm", "llama")])
def test_decode_step_with_fused_rope_equals_rope_then_attention(device, prefill_mode, arch):
    """Same logits and the same cache with RoPE fused into the attention or not. "graph" runs the
    prompt 8 tokens per replay: rows of one slot at consecutive positions, each attending to the
    rows before it in the same launch."""
    fused_logits, fused_cache = run_model(True, device, prefill_mode, arch)
    plain_logits, plain_cache = run_model(False, device, prefill_mode, arch)
    assert all(torch.equal(a, b) for a, b in zip(fused_logits, plain_logits))
    assert torch.equal(fused_cache, plain_cache)


def test_reference_ops_take_at_most_the_kernels_rows():
    from app.engine.cuda.ops import ReferenceOps
    from app.kernels.attention import ROPE_MAX_ROWS

    rows = ROPE_MAX_ROWS + 1
    cache = torch.zeros(1, 1, 64, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="at most 32 rows"):
        ReferenceOps().rope_attention(torch.zeros(rows, 3 * 64, dtype=torch.float16), None, None, None, None, None,
                                      cache, cache, num_q_heads=1, workspace=None,
                                      out=torch.zeros(rows, 1, 64, dtype=torch.float16))


# -- the kernel (GPU) ----------------------------------------------------------------------------

def setup_caches(slots_n, hkv, max_len, d, seed):
    from test_kernels_gpu import activations

    k = activations(slots_n * hkv, max_len * d, seed=seed).view(slots_n, hkv, max_len, d)
    v = activations(slots_n * hkv, max_len * d, seed=seed + 1).view(slots_n, hkv, max_len, d)
    return k, v


def both_ways(hq, hkv, d, max_len, positions, slots, seq_lens, seed, min_chunk=None):
    """(fused out, fused caches), (unfused out, unfused caches), the reference out."""
    from test_kernels_gpu import activations, poisoned, rope_tables

    from app.kernels import decode_attention, rope_decode_attention, rope_kv_write
    from app.kernels import reference as ref
    from app.kernels.attention import MIN_CHUNK

    dev = "cuda"
    chunk = dict(min_chunk=min_chunk or MIN_CHUNK)
    b = len(positions)
    positions, slots, seq_lens = (torch.tensor(x, dtype=torch.int32, device=dev) for x in (positions, slots, seq_lens))
    cos, sin = rope_tables(d, max_len)
    qkv = activations(b, (hq + 2 * hkv) * d, seed=seed) * 2
    k0, v0 = setup_caches(int(slots.max()) + 2, hkv, max_len, d, seed + 1)
    fk, fv, uk, uv, rk, rv = k0.clone(), v0.clone(), k0.clone(), v0.clone(), k0.clone(), v0.clone()
    fused = rope_decode_attention(qkv, cos, sin, positions, seq_lens, slots, fk, fv, num_q_heads=hq,
                                  out=poisoned(b, hq, d), **chunk)
    q = rope_kv_write(qkv, cos, sin, positions, slots, uk, uv, num_q_heads=hq, num_kv_heads=hkv)
    plain = decode_attention(q, uk, uv, seq_lens, slots, out=poisoned(b, hq, d), **chunk)
    q_ref = ref.rope_kv_write_ref(qkv, cos, sin, positions, slots, rk, rv, num_q_heads=hq, num_kv_heads=hkv)
    want = ref.decode_attention_ref(q_ref, rk, rv, seq_lens, slots)
    return (fused, fk, fv), (plain, uk, uv), want


ATTN_SHAPES = [(16, 2, 128), (28, 4, 128), (32, 8, 128), (9, 3, 64), (14, 2, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", ATTN_SHAPES)
def test_fused_rope_attention_is_bit_equal_to_rope_then_attention(hq, hkv, d):
    """Decode rows (one per slot, slots not in batch order, a pad row) at lengths 1..8,192, among
    them a last split holding only the new row (17 = 16 + 1)."""
    from test_kernels_gpu import REL_TOL, rel_err

    lens = [1, 17, 300, 4096, 8192, 0]
    slots = [5, 0, 3, 1, 2, -1]
    positions = [max(n - 1, 0) for n in lens]
    (fused, fk, fv), (plain, uk, uv), want = both_ways(hq, hkv, d, 8192, positions, slots, lens, seed=301)
    assert torch.equal(fused, plain)
    assert torch.equal(fk, uk) and torch.equal(fv, uv)
    for b, n in enumerate(lens):
        if n:
            assert rel_err(fused[b], want[b]) < REL_TOL, n
    assert torch.equal(fused[-1], torch.zeros_like(fused[-1]))  # the pad row: zeros, no cache write


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", [(16, 2, 128), (14, 2, 64)])
@pytest.mark.parametrize("min_chunk", [4, 16])
def test_fused_rope_rows_of_one_slot_see_each_other(hq, hkv, d, min_chunk):
    """The graph prefill's launch: 16 consecutive tokens of one slot as the rows (row j attends to
    0..start+j, the new rows of the rows before it included) and two other sequences' rows.
    min_chunk 4 spreads the new rows over several splits of each row."""
    from test_kernels_gpu import REL_TOL, rel_err

    start = 200
    positions = [start + j for j in range(16)] + [40, 7]
    slots = [1] * 16 + [0, 2]
    lens = [p + 1 for p in positions]
    (fused, fk, fv), (plain, uk, uv), want = both_ways(hq, hkv, d, 1024, positions, slots, lens, seed=401,
                                                       min_chunk=min_chunk)
    assert torch.equal(fused, plain)
    assert torch.equal(fk, uk) and torch.equal(fv, uv)
    assert rel_err(fused, want) < REL_TOL


@pytest.mark.gpu
def test_fused_rope_refuses_what_it_does_not_cover():
    from test_kernels_gpu import activations, rope_tables

    from app.kernels import rope_decode_attention
    from app.kernels.loader import KernelArgumentError

    k, v = setup_caches(1, 2, 64, 128, 7)
    cos, sin = rope_tables(128, 64)

    def call(rows, cache=k, table=cos):
        index = torch.zeros(rows, dtype=torch.int32, device="cuda")
        return rope_decode_attention(activations(rows, 20 * 128, 8), table, sin, index, index + 1, index, cache, v,
                                     num_q_heads=16)

    with pytest.raises(KernelArgumentError, match="rows of a fused RoPE attention=33"):
        call(33)
    with pytest.raises(KernelArgumentError, match="k_cache"):
        call(2, cache=k[0])
    with pytest.raises(KernelArgumentError, match="cos"):
        call(2, table=cos[:, :63])  # the kernel reads the angles 16 bytes at a time
    assert torch.isfinite(call(2)).all()

