"""Streaming quantizer: a Hugging Face folder (+ LoRA) -> a layered checkpoint.

The source is read tensor by tensor (safetensors ``safe_open``); one decoder layer is
quantized and written at a time, and the embedding / ``lm_head`` tables are read and
quantized in row chunks, so peak memory is about one layer (source dtype) plus one tensor in
fp32 plus the packed output, whatever the model size (docs/FORMATS.md has the measurements).

Resuming: a journal (``.quantize-journal.json``) records each finished file's size and
sha256 and the settings of the run. Run the same command again after an interruption and
finished files whose checksum still matches are skipped; anything else is redone. The
manifest is written last (atomically) and the journal removed, so a folder with
``manifest.json`` is always complete.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from app.engine.lora import LoraAdapter
from app.engine.tokenizer import Tokenizer
from app.engine.weights import TensorSource, check_tensor_names
from app.errors import ModelLoadError, QwenTrayError
from app.formats.checkpoint import (
    EMBEDDINGS_FILE,
    FP16,
    Manifest,
    TensorEntry,
    layer_file,
    write_manifest,
    write_tensor_file,
)
from app.formats.core import GROUP_SIZE, padded_k
from app.formats.recipe import TABLES, Recipe, plan_model
from app.formats.spec import ModelSpec
from app.formats.tensor import FORMAT_OF_BITS, QuantizedTensor
from app.model_folders import output_folder_lock
from app.quant import calibration as calib
from app.quant.methods import DEFAULT_METHOD
from app.quant.gptq import GptqSettings, GptqSolver
from app.quant.resume import CALIBRATED_METHODS, Journal, check_room_for_checkpoint, fingerprint, writing_checkpoint
from app.quant.search import quantize
from app.quant.source import copy_side_files, expected_shapes, open_adapter, table_chunks, to_fp16

METHODS = ("rtn", "search", *CALIBRATED_METHODS)

Progress = Callable[[str, int, int], None]
# GPTQ as `--method gptq` runs it: damping 0.1, act-order with static groups, calibration in windows
# of 512. Dropping any one of them read worse on held-out text in `mixed`; Hessians through the
# quantized layers (``sequential``) read worse in `w4` and `mixed` (docs/results/gptq_study.md).
GPTQ_SETTINGS = GptqSettings(damp=0.1, static=True, act_order=True)
GPTQ_CALIBRATION_WINDOW = 512


@dataclass
class QuantizeJob:
    """What to quantize, how, and where to (``qwen-tray quantize`` arguments)."""

    model: Path
    out: Path
    recipe: Recipe
    # gptq (error-compensating, app/quant/gptq.py) | calibrated (clipping search weighted by calibration
    # activations) | awq (calibrated + AWQ column scaling) | search (data-free clipping search) | rtn
    method: str = DEFAULT_METHOD
    adapter: Path | None = None
    calibration: Path | None = None  # text file for calibrated/awq/gptq; default: app/resources/text/calibration.txt
    calibration_tokens: int = calib.DEFAULT_CALIBRATION_TOKENS
    # tokens per calibration sequence, each from position 0; 0: all in one; None: the method's own (gptq:
    # GPTQ_CALIBRATION_WINDOW; calibrated/awq: all in one, as measured in docs/results/gptq_study.md)
    calibration_window: int | None = None
    gptq: GptqSettings = GPTQ_SETTINGS  # how method gptq runs (damping, scales, act-order)
    device: str = "cpu"  # where the clipping search and GPTQ run ("cuda" is ~20x faster)
    # the model's name in the manifest (`checkpoint info`); default: the source folder's name, which
    # for a download or a GGUF import is a staging name (Qwen2.5-3B-Instruct.hf, .NAME.fp16)
    model_id: str = ""

    def __post_init__(self) -> None:
        self.model, self.out = Path(self.model), Path(self.out)
        self.model_id = self.model_id or self.model.resolve().name
        self.adapter = Path(self.adapter) if self.adapter else None
        if self.method not in METHODS:
            raise QwenTrayError(f"--method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not 16 <= self.calibration_tokens <= calib.MAX_CALIBRATION_TOKENS:
            raise QwenTrayError(f"calibration tokens must be 16..{calib.MAX_CALIBRATION_TOKENS}, "
                                f"got {self.calibration_tokens}")
        if self.calibration_window is None:
            self.calibration_window = GPTQ_CALIBRATION_WINDOW if self.method == "gptq" else 0
        if self.calibration_window and not 16 <= self.calibration_window <= calib.MAX_CALIBRATION_TOKENS:
            raise QwenTrayError(f"calibration window must be 0 (one sequence) or 16..{calib.MAX_CALIBRATION_TOKENS} "
                                f"tokens, got {self.calibration_window}")
        if self.gptq.group_size != GROUP_SIZE:
            raise QwenTrayError(f"GPTQ group size must be {GROUP_SIZE} (the stored format's), got {self.gptq.group_size}")
        if not self.model.is_dir():
            raise ModelLoadError(f"{self.model}: model folder not found")
        if self.out.resolve() == self.model.resolve():
            raise QwenTrayError(f"{self.out}: --out must not be the model folder")
        file_in_the_way = next((p for p in (self.out, *self.out.parents) if p.exists() and not p.is_dir()), None)
        if file_in_the_way is not None:
            raise QwenTrayError(f"{self.out}: --out must be a folder, but {file_in_the_way} is a file")


def check_fused_bits(recipe: Recipe, spec: ModelSpec) -> None:
    """q/k/v (and gate/up) are fused into one matrix at load, so they need the same bits."""
    groups = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))
    for i in range(spec.num_layers):
        for block, names in groups:
            bits = {n: recipe.bits_for(f"model.layers.{i}.{block}.{n}") for n in names}
            if len(set(bits.values())) > 1:
                detail = ", ".join(f"{n}={b}" for n, b in bits.items())
                raise QwenTrayError(f"recipe {recipe.name}: model.layers.{i}.{block} gives {detail} bits, but "
                                    f"{'/'.join(names)} are fused into one matrix; give them the same bits")


def quantize_model(job: QuantizeJob, progress: Progress | None = None,
                   on_resume: Callable[[int, int], None] | None = None) -> Manifest:
    """Quantize ``job.model`` into ``job.out`` (resuming a previous run); return the manifest.
    ``on_resume(done, total)``: called once, before the first progress, when a previous run's
    files are taken over; ``progress(file, done, total)`` before each file is quantized (after a
    resume, from the count already done), then ``progress("done", total, total)``. Another
    process quantizing into ``job.out`` now is refused (FolderBusyError), not resumed."""
    with output_folder_lock(job.out):
        return _quantize_model(job, progress, on_resume)


def _quantize_model(job: QuantizeJob, progress: Progress | None,
                    on_resume: Callable[[int, int], None] | None) -> Manifest:
    spec = ModelSpec.from_hf_folder(job.model)
    shapes = expected_shapes(job.model, spec)
    check_fused_bits(job.recipe, spec)
    adapter = open_adapter(job.adapter, shapes)
    with TensorSource(job.model) as source:
        check_tensor_names(source, set(shapes), spec)
    started = fingerprint(job)
    check_room_for_checkpoint(job.out, job.model_id, plan_model(job.recipe, shapes.items()).total_bytes)
    with writing_checkpoint(job.out, None):
        journal = Journal(job.out, started)
    run = _Run(job, spec, shapes, adapter)
    units = [(layer_file(i), i) for i in range(spec.num_layers)] + [(EMBEDDINGS_FILE, None)]
    done_before = {file_name for file_name, _ in units if journal.finished(file_name)}
    if done_before and on_resume is not None:
        on_resume(len(done_before), len(units))
    # The count starts at what is already done: skipping a finished file is not progress (a bar
    # would redo the finished files' count and show their skipping as a rate).
    done = len(done_before)
    for file_name, index in units:
        if file_name in done_before:
            continue
        if progress is not None:
            progress(file_name, done, len(units))
        tensors = run.layer(index) if index is not None else run.tables()
        with writing_checkpoint(job.out, journal):
            journal.record(file_name, write_tensor_file(job.out / file_name, tensors.stored), tensors.entries)
        del tensors  # before the next layer is read
        done += 1
    if progress is not None:
        progress("done", len(units), len(units))
    with writing_checkpoint(job.out, journal):
        copied = copy_side_files(job.model, job.out)
        manifest = Manifest(spec=spec, recipe=job.recipe, method=job.method, files=journal.files,
                            tensors=journal.tensors, copied_files=tuple(copied), model_id=job.model_id,
                            adapter=job.adapter.name if job.adapter else None)
        write_manifest(job.out, manifest)
        journal.remove()
    return manifest


@dataclass
class _Quantized:
    stored: dict[str, torch.Tensor] = field(default_factory=dict)  # safetensors name -> tensor
    entries: dict[str, TensorEntry] = field(default_factory=dict)  # HF name -> manifest entry


class _Run:
    """One quantize run's state: the source, the adapter and (calibrated/awq) the calibration.

    The source is reopened for every read: safetensors maps the file, and the pages read
    through a mapping stay resident (counted in RSS) until it is dropped, so a mapping must
    not outlive the tensors read through it.
    """

    def __init__(self, job: QuantizeJob, spec: ModelSpec, shapes: dict, adapter: LoraAdapter | None):
        self.job, self.spec, self.shapes, self.adapter = job, spec, shapes, adapter
        self.calibration: calib.Calibration | None = None

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        out = {}
        with TensorSource(self.job.model) as source:
            for name in names:
                t = source.get(name)
                if tuple(t.shape) != self.shapes[name]:
                    raise ModelLoadError(f"{self.job.model}: tensor {name!r} has shape {tuple(t.shape)}, "
                                         f"expected {self.shapes[name]} from config.json")
                out[name] = self.adapter.merge(name, t) if self.adapter else t
        return out

    def layer_names(self, index: int) -> list[str]:
        prefix = f"model.layers.{index}."
        return [name for name in self.shapes if name.startswith(prefix)]

    def layer(self, index: int) -> _Quantized:
        out = _Quantized()
        names = self.layer_names(index)
        if self.job.method not in CALIBRATED_METHODS:
            for name in names:  # one tensor mapped at a time: its pages leave RSS with it
                t = self.read([name])[name]
                _store(out, name, t, layer_file(index), self._bits(name), self.job, None)
            return out
        tensors = self.read(names)
        gptq = self.job.method == "gptq"
        sequential = gptq and self.job.gptq.sequential
        calibrated = self._calibrated(index).run_layer(index, tensors, self.job.device if gptq else None,
                                                       keep_input=sequential)
        if self.job.method == "awq":
            importance = calib.apply_awq(index, tensors, calibrated.stats, self.job.recipe)
        else:
            importance = calib.activation_importance(index, calibrated.stats, self.job.recipe)
        if gptq:  # one factorised Hessian per input, freed before the next one is built
            for key, modules in calib.INPUTS.items():
                solver = None
                for module in modules:
                    name = f"model.layers.{index}.{module}.weight"
                    if self._bits(name) != 16 and solver is None:
                        solver = self._solver(calibrated.hessians.pop(key), name)
                    _store(out, name, tensors.pop(name), layer_file(index), self._bits(name), self.job, None, solver)
                del solver
        for name in list(tensors):
            _store(out, name, tensors.pop(name), layer_file(index), self._bits(name), self.job, importance.get(name))
        if sequential:  # the next layer's Hessians see this layer as it was quantized
            self.calibration.redo_layer(index, _AsWritten(out.stored, names, self.shapes))
        return out

    def _solver(self, hessian: torch.Tensor, name: str) -> GptqSolver:
        """GPTQ's factorised Hessian, padded like the weights to whole 128-column groups."""
        pad = padded_k(hessian.shape[0]) - hessian.shape[0]
        if pad:
            hessian = F.pad(hessian, (0, pad, 0, pad))  # padded inputs are zero: dead channels
        return GptqSolver(hessian, self.job.gptq, name=name, device=self.job.device, overwrite=True)

    def _calibrated(self, index: int) -> calib.Calibration:
        """The calibration state at layer ``index`` (after a resume: replayed through float layers)."""
        if self.calibration is None:
            tokenizer = Tokenizer.from_folder(self.job.model)
            ids = calib.calibration_ids(tokenizer, self.job.calibration, self.job.calibration_tokens,
                                        self.spec.vocab_size)
            self.calibration = calib.Calibration(self.spec, self._embedding_rows(ids), self.job.calibration_window)
        while self.calibration.next_layer < index:
            i = self.calibration.next_layer
            if self.job.method == "gptq" and self.job.gptq.sequential:  # replay layer i as it was written
                written = load_file(str(self.job.out / layer_file(i)))
                self.calibration.run_layer(i, _AsWritten(written, self.layer_names(i), self.shapes))
            else:
                self.calibration.run_layer(i, self.read(self.layer_names(i)))  # no Hessians: layer i is done
        return self.calibration

    def _embedding_rows(self, ids: list[int]) -> torch.Tensor:
        """Rows ``ids`` of the embedding table, read in chunks -> [T, hidden] fp32."""
        name = "model.embed_tokens.weight"
        wanted = torch.tensor(ids)
        out = torch.empty(len(ids), self.shapes[name][1])
        for rows, chunk in table_chunks(self.job.model, name, self.shapes[name]):
            hit = (wanted >= rows.start) & (wanted < rows.stop)
            out[hit] = chunk[wanted[hit] - rows.start].float()
        return out

    def tables(self) -> _Quantized:
        """Embedding, lm_head (untied models) and the final norm."""
        out = _Quantized()
        norm = self.read(["model.norm.weight"])["model.norm.weight"]
        head = "lm_head.weight" if "lm_head.weight" in self.shapes else "model.embed_tokens.weight"
        head_importance, head_solver = None, None
        if self.job.method in CALIBRATED_METHODS and self._bits(head) != 16:
            calibration = self._calibrated(self.spec.num_layers)
            head_importance = calibration.head_stats(norm, self.spec.rms_norm_eps).mean_sq
            # GPTQ only for an untied head: error feedback across columns would move the rows a
            # tied table also serves as embeddings (which no Hessian of the head's input sees).
            if self.job.method == "gptq" and head == "lm_head.weight":
                hessian = calibration.head_hessian(norm, self.spec.rms_norm_eps, self.job.device)
                head_solver = self._solver(hessian, head)
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in self.shapes:
                self._store_table(out, name, head_importance if name == head else None,
                                  head_solver if name == head else None)
        _store(out, "model.norm.weight", norm, EMBEDDINGS_FILE, 16, self.job, None)
        return out

    def _store_table(self, out: _Quantized, name: str, importance: torch.Tensor | None,
                     solver: GptqSolver | None = None) -> None:
        shape, module = self.shapes[name], name.removesuffix(".weight")
        bits = self._bits(name)
        if bits == 16 or (self.adapter and module in self.adapter.pairs):
            # kept fp16, or a LoRA on the table (rare): the whole tensor at once
            _store(out, name, self.read([name])[name], EMBEDDINGS_FILE, bits, self.job, importance, solver)
            return
        n, k = shape
        fmt = FORMAT_OF_BITS[bits]
        packed = {key: torch.empty(s, dtype=dt) for key, (s, dt) in
                  QuantizedTensor.expected_shapes(fmt, n, padded_k(k)).items()}  # [N, ...] per packed tensor
        for rows, chunk in table_chunks(self.job.model, name, shape):
            qt = _quantize_weight(f"{module}[{rows.start}:{rows.stop}]", chunk, bits, self.job, importance, solver)
            for key, t in qt.tensors.items():
                packed[key][rows] = t
        out.stored.update(QuantizedTensor(fmt, (n, padded_k(k)), packed, name=module).state_dict(module))
        out.entries[name] = TensorEntry(EMBEDDINGS_FILE, fmt, shape)

    def _bits(self, name: str) -> int:
        shape = self.shapes[name]
        if not name.endswith(".weight") or len(shape) != 2:
            return 16
        module = name.removesuffix(".weight")
        if module in TABLES:
            return self.job.recipe.table_bits(module, self.spec.tie_word_embeddings)
        return self.job.recipe.bits_for(module)


def _store(out: _Quantized, name: str, t: torch.Tensor, file_name: str, bits: int, job: QuantizeJob,
           importance: torch.Tensor | None, solver: GptqSolver | None = None) -> None:
    if bits == 16:
        out.stored[name] = to_fp16(name, t)
        out.entries[name] = TensorEntry(file_name, FP16, tuple(t.shape))
        return
    module = name.removesuffix(".weight")
    qt = _quantize_weight(module, t, bits, job, importance, solver)
    out.stored.update(qt.state_dict(module))
    out.entries[name] = TensorEntry(file_name, qt.format, tuple(t.shape))


def _quantize_weight(name: str, w: torch.Tensor, bits: int, job: QuantizeJob,
                     importance: torch.Tensor | None, solver: GptqSolver | None = None) -> QuantizedTensor:
    """Quantize W [N, K], zero-padding K up to a multiple of 128 (the padding quantizes to 0).

    W stays in its dtype: the quantizer widens it to fp32 one row chunk at a time. With a
    ``solver`` (method gptq) the columns are quantized with error compensation.
    """
    k = w.shape[1]
    pad = padded_k(k) - k
    wf = F.pad(w, (0, pad)) if pad else w  # [N, K + pad]
    if solver is not None:
        return solver.quantize(wf, bits, name=name)
    if importance is not None and pad:
        importance = F.pad(importance.float(), (0, pad))
    method = "rtn" if job.method == "rtn" else "search"
    device = job.device if method == "search" else None
    return quantize(wf, bits, name=name, method=method, importance=importance, device=device)


class _AsWritten(Mapping):
    """A layer's HF tensors as written (fp16 ones as is, quantized ones dequantized with the K padding
    cut), each made when read: building a float layer from it holds one dequantized tensor at a time."""

    def __init__(self, stored: dict[str, torch.Tensor], names: list[str], shapes: dict[str, tuple[int, ...]]):
        self.stored, self.names, self.shapes = stored, names, shapes

    def __contains__(self, name: object) -> bool:  # without dequantizing (Mapping's would read the item)
        return name in self.names

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        if name in self.stored:
            return self.stored[name]
        module = name.removesuffix(".weight")
        return QuantizedTensor.from_state_dict(module, self.stored).dequantize()[:, :self.shapes[name][1]]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)
