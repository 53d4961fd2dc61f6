"""Engine: the one Python API the CLI, the server and the tray app use (docs/ENGINE_API.md)."""

from __future__ import annotations

import ctypes
import gc
import logging
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from app import kernels
from app.engine.cuda.memory import GpuInfo, parse_size
from app.engine.cuda.ops import unsupported_shape
from app.engine.cuda.reference_fit import reference_device
from app.engine.cuda.runner import create_cuda_runner
from app.engine.kv_cache import StaticKVCache
from app.engine.loading import LoadedModel, context_length, load_model
from app.engine.params import SamplingParams
from app.engine.request import PRIORITY_NORMAL, Generation, Request
from app.engine.runner import RunnerOptions, TorchRunner
from app.engine.scheduler import LOOKUP_MAX_DRAFT, Scheduler
from app.engine.skeleton import load_skeleton
from app.engine.tokenizer import Message, Tokenizer
from app.errors import ContextLengthError, InvalidParameterError, QwenTrayError
from app.formats import checkpoint
from app.formats.spec import ModelSpec

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, int], None]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        from app.kernels.no_cuda import why_no_cuda

        raise QwenTrayError(f"--device cuda: {why_no_cuda()}")
    if device not in ("cpu", "cuda"):
        raise QwenTrayError(f"device must be cpu, cuda or auto, got {device!r}")
    return torch.device(device)


class Engine:
    def __init__(self, loaded: LoadedModel, runner, max_batch_size: int, lookup_draft: int = LOOKUP_MAX_DRAFT):
        """``lookup_draft``: tokens guessed from the sequence itself per decode step at most
        (app.engine.lookup; 0 turns guessing off). Only a runner that checks several tokens
        of one sequence per step (the CUDA runner) guesses. Greedy output is the same either
        way; sampled tokens follow the same distribution."""
        self.loaded = loaded
        self.spec = loaded.spec
        self.tokenizer = loaded.tokenizer
        self.model_id = loaded.model_id
        self.path = loaded.path
        self.runner = runner
        self.device = runner.device.type
        self.max_context = runner.max_context
        self.max_batch_size = max_batch_size
        # Why a model on a machine with a GPU runs without the CUDA kernels (PyTorch on the GPU,
        # or the CPU when it is too large for the GPU that way); None when the kernels serve it.
        self.kernels_unavailable: str | None = None
        self._scheduler = Scheduler(runner, self.tokenizer, self.spec.vocab_size, frozenset(self.spec.eos_token_ids),
                                    lookup_draft=lookup_draft)
        self.closed = False
        # Stops the scheduler thread when close() is not called: when the engine is collected, or
        # at interpreter exit (weakref.finalize runs before daemon threads are frozen; one that is
        # then still inside PyTorch aborts the process: "terminate called without an active exception").
        self._shutdown = weakref.finalize(self, _shut_down, self._scheduler, runner)

    @classmethod
    def load(cls, path: str | Path, *, device: str = "auto", max_batch_size: int = 4,
             max_context: int | None = None, adapter: str | Path | None = None,
             dtype: torch.dtype | None = None, progress: ProgressCallback | None = None,
             vram_budget: int | str | None = None, lookup_draft: int = LOOKUP_MAX_DRAFT,
             fit_to_vram: bool = False, runner_options: RunnerOptions | None = None,
             verify: bool = False, model_id: str | None = None) -> Engine:
        """``vram_budget`` (bytes or "3.2GiB"): what the CUDA runner may allocate; default: the
        card's free memory minus a margin. A model or context that does not fit is refused, or
        with ``fit_to_vram`` loaded with fewer concurrent requests, then a shorter context (at
        least 1,024 tokens; ``max_batch_size`` and ``max_context`` then say what was chosen).
        ``lookup_draft``: see :class:`Engine` (0: never guess tokens). ``runner_options``: how
        the CUDA runner builds its step (benchmarks; the reference runner has no options).
        ``verify``: hash every file of a checkpoint, even those verified before and unchanged
        since (app.formats.verified). ``model_id``: the name the model goes by (its registered
        name, which the caller resolved); default: the folder's name."""
        if max_batch_size < 1:
            raise InvalidParameterError("max_batch_size", f"must be >= 1, got {max_batch_size}")
        if lookup_draft < 0:
            raise InvalidParameterError("lookup_draft", f"must be >= 0 (0 turns guessing off), got {lookup_draft}")
        dev = resolve_device(device)
        model_id = model_id or Path(path).name
        started = time.perf_counter()
        reason = _cuda_runner_unavailable(dev, dtype, Path(path))
        on_gpu_machine = dev.type == "cuda"  # (dev may become the CPU below)
        if reason is None:
            loaded, runner = _load_on_cuda(Path(path), model_id, dev, max_batch_size, max_context, adapter, progress,
                                           vram_budget, fit_to_vram, runner_options, verify)
            max_batch_size = runner.num_slots
        else:
            if dev.type == "cuda":  # the GPU if the dense model fits it, else the CPU (auto) or an error
                dev = _reference_device(Path(path), dev, device, reason, max_batch_size, max_context, vram_budget,
                                        dtype, model_id)
            loaded = load_model(Path(path), dev, adapter=adapter, dtype=dtype, max_context=max_context,
                                progress=progress, verify=verify)
            cache = StaticKVCache(loaded.spec, max_batch_size, loaded.model.max_positions, loaded.dtype, dev,
                                  zeroed=False)  # (TorchRunner reads only what it wrote)
            runner = TorchRunner(loaded.model, cache, dev)
        loaded.model_id = model_id
        release_freed_memory()  # the load's temporaries
        log.info("loaded %s on %s in %.2f s", loaded.model_id, dev, time.perf_counter() - started)
        engine = cls(loaded, runner, max_batch_size, lookup_draft)
        if reason is not None and on_gpu_machine:
            engine.kernels_unavailable = reason
        return engine

    @classmethod
    def from_runner(cls, runner, spec: ModelSpec, tokenizer: Tokenizer, *, model_id: str,
                    lookup_draft: int = LOOKUP_MAX_DRAFT) -> Engine:
        """An engine over a runner that already holds its weights (e.g. synthetic weights in a
        benchmark): no folder is read; one request per KV-cache slot of the runner."""
        loaded = LoadedModel(path=None, model_id=model_id, spec=spec, tokenizer=tokenizer, model=None,
                             dtype=torch.float16)  # no DecoderModel: the runner owns the weights
        return cls(loaded, runner, runner.num_slots, lookup_draft)

    # -- requests -------------------------------------------------------------------------
    def chat(self, messages: list[Message], params: SamplingParams | None = None,
             priority: int = PRIORITY_NORMAL) -> Generation:
        return self.generate(self.tokenizer.encode_chat(messages), params, priority)

    def complete(self, prompt: str, params: SamplingParams | None = None, priority: int = PRIORITY_NORMAL) -> Generation:
        return self.generate(self.tokenizer.encode(prompt), params, priority)

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                 priority: int = PRIORITY_NORMAL) -> Generation:
        params = params or SamplingParams()
        limit = self.max_context - 1
        if len(prompt_ids) > limit:
            raise ContextLengthError(
                f"the prompt has {len(prompt_ids)} tokens; this model's context allows at most {limit}",
                limit=limit, requested=len(prompt_ids))
        bad = [i for i in prompt_ids if not 0 <= i < self.spec.vocab_size]
        if bad:
            raise QwenTrayError(f"token id {bad[0]} is outside the vocabulary (size {self.spec.vocab_size})")
        request = Request(list(prompt_ids), params, priority)
        self._scheduler.submit(request)
        return request.handle

    # -- lifecycle ------------------------------------------------------------------------
    def stats(self) -> dict:
        return {**self._scheduler.stats(), "device": self.device, "model": self.model_id,
                "max_context": self.max_context, **self.runner.memory_info()}

    def close(self) -> None:
        """Stop the scheduler and free the model's memory (model switch, quit)."""
        if self.closed:
            return
        self.closed = True
        self._shutdown()  # the scheduler, then the runner
        self.runner = self.loaded = None  # drop the last references to weights and cache
        gc.collect()
        release_freed_memory()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def release_freed_memory() -> None:
    """Give the heap that glibc keeps after large frees back to the system (a load's temporaries,
    a closed model's weights on the CPU): measured on the 3B on the CPU, 0.9 GB of the resident
    set was memory already freed. Elsewhere the allocators return it themselves."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl): nothing to trim this way
        pass


def _shut_down(scheduler: Scheduler, runner) -> None:
    scheduler.close()
    runner.close()


def _cuda_runner_unavailable(dev: torch.device, dtype: torch.dtype | None, path: Path) -> str | None:
    """None when the CUDA runner (own kernels, CUDA graphs) can serve this load, else why not."""
    if dev.type != "cuda":
        return "not a CUDA device"
    if dtype not in (None, torch.float16):
        return f"the CUDA runner computes in float16, {dtype} was asked for"
    reason = kernels.unavailable_reason()
    if reason is None and path.is_dir():  # a missing folder: the loader below says so
        reason = unsupported_shape(_read_spec(path))
    return reason


def _reference_device(path: Path, dev: torch.device, asked: str, reason: str, num_slots: int,
                      max_context: int | None, vram_budget: int | str | None, dtype: torch.dtype | None,
                      label: str) -> torch.device:
    """Where PyTorch's path runs a model the CUDA runner cannot take (app.engine.cuda.reference_fit)."""
    if not path.is_dir():
        return dev  # the loader names the missing folder
    spec = _read_spec(path)
    return reference_device(spec, asked=asked, reason=reason, num_slots=num_slots,
                            context=context_length(spec.max_position_embeddings, max_context),
                            vram_budget=parse_size(vram_budget) if isinstance(vram_budget, str) else vram_budget,
                            gpu=GpuInfo.of(dev), device=dev, dtype=dtype or torch.float16, label=label)


def _read_spec(path: Path) -> ModelSpec:
    """The model's shapes without loading weights (a quantized checkpoint keeps them in its manifest)."""
    return checkpoint.read_manifest(path).spec if checkpoint.is_checkpoint(path) else ModelSpec.from_hf_folder(path)


def _load_on_cuda(path: Path, model_id: str, dev: torch.device, max_batch_size: int, max_context: int | None, adapter,
                  progress: ProgressCallback | None, vram_budget: int | str | None, fit: bool,
                  options: RunnerOptions | None, verify: bool):
    """Plan the VRAM from the model's shapes, then read each weight from its file straight into
    its place on the GPU (app.engine.skeleton): the host never holds the model."""
    budget = parse_size(vram_budget) if isinstance(vram_budget, str) else vram_budget
    skeleton = load_skeleton(path, adapter=adapter, max_context=max_context, verify=verify)
    loaded = skeleton.loaded
    loaded.model_id = model_id
    runner = create_cuda_runner(loaded.model, num_slots=max_batch_size, max_context=loaded.model.max_positions,
                                device=dev, vram_budget=budget, label=loaded.model_id, fit=fit, progress=progress,
                                options=options, fill=skeleton.fill)
    return loaded, runner

