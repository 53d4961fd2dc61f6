"""Layered quantized checkpoints: manifest, atomic file writes, validation, reading.

A checkpoint folder (docs/FORMATS.md, "Checkpoint layout") holds ``manifest.json``, one
safetensors file per decoder layer (``layer_000.safetensors`` ...), ``embeddings.safetensors``
(embedding, ``lm_head``, final norm) and the source's tokenizer/config files. The manifest
records every weight file's size and sha256 and every tensor's format and logical shape.

Loading verifies all of it before touching a tensor: a missing, truncated or changed file or
a manifest of another format version is a one-line :class:`~app.errors.ModelLoadError`
naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from app import __version__
from app.errors import ModelLoadError, QwenTrayError
from app.formats.core import GROUP_SIZE, padded_k
from app.formats.recipe import Recipe
from app.formats.spec import ModelSpec
from app.formats.tensor import FORMATS, QuantizedTensor
from app.formats.verified import VerifiedFiles

FORMAT_NAME = "qwen-tray-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = ".quantize-journal.json"  # an unfinished quantization's (app/quant/resume.py writes it)
EMBEDDINGS_FILE = "embeddings.safetensors"
FP16 = "fp16"
# Copied from the source folder when present (tokenizer, chat template, configs for reference).
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                "tokenizer.model", "chat_template.jinja", "chat_template.json")
_HASH_BLOCK = 8 << 20


def layer_file(index: int) -> str:
    return f"layer_{index:03d}.safetensors"


@dataclass(frozen=True)
class FileEntry:
    bytes: int
    sha256: str


@dataclass(frozen=True)
class TensorEntry:
    """One HF tensor (``model.layers.0.mlp.down_proj.weight``) as stored in ``file``.

    ``format`` is ``w4``/``w3`` (stored as ``<module>.qweight`` ... with K padded to
    ``stored_k``) or ``fp16`` (stored under its own name). ``shape`` is the logical shape.
    """

    file: str
    format: str
    shape: tuple[int, ...]

    @property
    def stored_k(self) -> int:
        return padded_k(self.shape[1])

    @property
    def nbytes(self) -> int:
        if self.format == FP16:
            return _numel(self.shape) * 2
        n, k = self.shape[0], self.stored_k
        return n * k * FORMATS[self.format][0] // 8 + n * (k // GROUP_SIZE) * 2

    def to_dict(self) -> dict:
        d = {"file": self.file, "format": self.format, "shape": list(self.shape)}
        if self.format != FP16:
            d["stored_k"] = self.stored_k
        return d


@dataclass(frozen=True)
class Manifest:
    spec: ModelSpec
    recipe: Recipe
    method: str
    files: dict[str, FileEntry]
    tensors: dict[str, TensorEntry]
    copied_files: tuple[str, ...] = ()
    model_id: str = ""
    adapter: str | None = None
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        """Bytes of all weights as stored (packed values, scales, fp16 tensors)."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def total_params(self) -> int:
        return sum(_numel(t.shape) for t in self.tensors.values())

    @property
    def bits_per_weight(self) -> float:
        return self.total_bytes * 8 / self.total_params

    def to_dict(self) -> dict:
        return {
            "format": FORMAT_NAME, "format_version": self.format_version, "created": self.created,
            "qwen_tray_version": __version__, "model_id": self.model_id, "adapter": self.adapter,
            "spec": self.spec.to_dict(),
            "recipe": {"name": self.recipe.name, "default_bits": self.recipe.default_bits,
                       "rules": [list(rule) for rule in self.recipe.rules]},
            "method": self.method, "group_size": GROUP_SIZE, "checksum": "sha256 of each whole file",
            "files": {name: {"bytes": f.bytes, "sha256": f.sha256} for name, f in self.files.items()},
            "tensors": {name: t.to_dict() for name, t in self.tensors.items()},
            "copied_files": list(self.copied_files),
            "summary": {"params": self.total_params, "bytes": self.total_bytes,
                        "bits_per_weight": round(self.bits_per_weight, 4)},
        }


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- writing ------------------------------------------------------------------------------

def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file beside ``path``, flush it to disk, then rename over."""
    tmp = _temp_path(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_tensor_file(path: Path, tensors: dict[str, torch.Tensor]) -> FileEntry:
    """Save ``tensors`` as one safetensors file atomically; return its size and sha256.

    ``save_file`` writes straight from the tensors (no second in-memory copy of the file);
    the checksum is then read back from disk, so it covers exactly the bytes written. The file
    gets the mode any file the user creates gets (0644 under the usual umask): safetensors
    writes through a private temporary file (0600), which the temp file here is given back.
    """
    tmp = _temp_path(path)
    try:
        tmp.open("wb").close()  # created as open() creates files: 0666 less the umask
        mode = tmp.stat().st_mode & 0o777
        _save_safetensors({k: v.contiguous() for k, v in tensors.items()}, tmp)
        os.chmod(tmp, mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        entry = FileEntry(tmp.stat().st_size, sha256_file(tmp))
        os.replace(tmp, path)
    except BaseException:  # also Ctrl+C: no half-written file left beside the finished ones
        tmp.unlink(missing_ok=True)
        raise
    return entry


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``save_file``, with a failed write raised as the OSError it was: safetensors reports a full
    disk as SafetensorError("... I/O error: No space left on device (os error 28)")."""
    try:
        save_file(tensors, str(path), metadata={"format": FORMAT_NAME})
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from e


def write_manifest(folder: Path, manifest: Manifest) -> None:
    text = json.dumps(manifest.to_dict(), indent=1, ensure_ascii=False) + "\n"
    write_atomic(folder / MANIFEST, text.encode("utf-8"))


# -- reading and validation ---------------------------------------------------------------

def is_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint: its manifest, or its weight files alone (the
    manifest deleted: :func:`read_manifest` then says that it is missing)."""
    folder = Path(folder)
    return (folder / MANIFEST).is_file() or _has_weight_files(folder)


def _has_weight_files(folder: Path) -> bool:
    return (folder / EMBEDDINGS_FILE).is_file() or (folder / layer_file(0)).is_file()


def read_manifest(folder: str | Path) -> Manifest:
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        why = ("the folder holds a checkpoint's weight files without it; quantize the model again"
               if _has_weight_files(Path(folder)) else "not a qwen-tray checkpoint folder")
        if (Path(folder) / JOURNAL).is_file():  # written last: this is a quantization cut short, not a broken one
            why = (f"an unfinished quantization ({JOURNAL} is there): run the command that started it "
                   "(`qwen-tray quantize`, `models get`) again and it resumes from the finished layers")
        raise ModelLoadError(f"the manifest {path} is missing ({why})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise ModelLoadError(f"{path}: not a {FORMAT_NAME} manifest")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ModelLoadError(f"{path}: checkpoint format version {version!r} is not supported "
                             f"(this qwen-tray reads version {FORMAT_VERSION}; quantize the model again)")
    try:
        return _manifest_from_dict(data)
    except QwenTrayError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from None


def _manifest_from_dict(d: dict) -> Manifest:
    recipe = d["recipe"]
    tensors = {}
    for name, t in d["tensors"].items():
        entry = TensorEntry(str(t["file"]), str(t["format"]), tuple(int(x) for x in t["shape"]))
        if entry.format not in (FP16, *FORMATS) or entry.file not in d["files"]:
            raise ValueError(f"tensor {name}: unknown format {entry.format!r} or file {entry.file!r}")
        if entry.format != FP16 and len(entry.shape) != 2:
            raise ValueError(f"tensor {name}: a quantized tensor must be 2-D")
        tensors[name] = entry
    files = {str(n): FileEntry(int(f["bytes"]), str(f["sha256"])) for n, f in d["files"].items()}
    for name in files:
        if Path(name).name != name:  # a manifest must not point outside its folder
            raise ValueError(f"file name {name!r} is not a plain file name")
    return Manifest(
        spec=ModelSpec.from_dict(d["spec"]),
        recipe=Recipe(recipe["name"], tuple((str(p), int(b)) for p, b in recipe["rules"]), int(recipe["default_bits"])),
        method=str(d["method"]), files=files, tensors=tensors,
        copied_files=tuple(d.get("copied_files", ())), model_id=str(d.get("model_id", "")),
        adapter=d.get("adapter"), created=str(d.get("created", "")), format_version=int(d["format_version"]))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    buf = bytearray(_HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])  # hashlib releases the GIL here, so files hash in parallel
    return digest.hexdigest()


def check_file(path: Path, entry: FileEntry, *, checksum: bool = True, verified: VerifiedFiles | None = None) -> None:
    """Raise ModelLoadError naming ``path`` if it is missing, of another size or changed.

    ``verified``: skip the hash of a file remembered there as verified and unchanged since
    (app.formats.verified: its stat and sampled blocks), and remember the file once it passes."""
    if not path.is_file():
        raise ModelLoadError(f"{path}: checkpoint file is missing (listed in {MANIFEST})")
    size = path.stat().st_size
    if size < entry.bytes:
        raise ModelLoadError(f"{path}: file is truncated ({size} bytes, {MANIFEST} says {entry.bytes})")
    if size != entry.bytes:
        raise ModelLoadError(f"{path}: file has {size} bytes, {MANIFEST} says {entry.bytes} (changed after quantization?)")
    if not checksum:
        return
    # taken before the hash: a file changed while it is hashed no longer matches next time
    stamp = verified.stamp(path) if verified is not None else None
    if stamp is not None and verified.is_verified(path, entry.sha256, stamp):
        return
    if sha256_file(path) != entry.sha256:
        raise ModelLoadError(f"{path}: sha256 checksum mismatch (the file is corrupt or was changed after quantization)")
    if stamp is not None:
        verified.remember(path, entry.sha256, stamp)


def verify_files(folder: Path, files: dict[str, FileEntry], *, checksum: bool = True,
                 reuse_verified: bool = True) -> None:
    """Check every file (sizes first, then checksums on all cores); first error wins.

    ``reuse_verified``: files verified before and unchanged since (app.formats.verified) are
    not hashed again; False hashes every file."""
    for name, entry in files.items():
        check_file(folder / name, entry, checksum=False)
    if checksum:
        verified = VerifiedFiles() if reuse_verified else None
        workers = max(1, min(len(files), os.cpu_count() or 1))
        try:
            with ThreadPoolExecutor(workers) as pool:
                for _ in pool.map(lambda item: check_file(folder / item[0], item[1], verified=verified),
                                  files.items()):
                    pass
        finally:  # files that passed before another failed are remembered too
            if verified is not None:
                verified.save()


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read safetensors file ({e})") from None


Weight = QuantizedTensor | torch.Tensor


def iter_weights(folder: Path, manifest: Manifest) -> Iterator[tuple[str, TensorEntry, Weight]]:
    """(HF name, entry, QuantizedTensor or fp16 tensor) for every tensor, file by file.

    Each file is opened (memory-mapped) once; every stored tensor is checked against the
    manifest's format and shape, so a malformed file fails here with its name.
    """
    by_file: dict[str, list[tuple[str, TensorEntry]]] = {}
    for name, entry in manifest.tensors.items():
        by_file.setdefault(entry.file, []).append((name, entry))
    for file_name, entries in by_file.items():
        path = folder / file_name
        handle = _open(path)
        stored = set(handle.keys())
        for name, entry in entries:
            yield name, entry, _read_weight(handle, stored, name, entry, path)


def _read_weight(handle, stored: set[str], name: str, entry: TensorEntry, path: Path) -> Weight:
    try:
        if entry.format == FP16:
            if name not in stored:
                raise ModelLoadError(f"{path}: tensor {name!r} is missing")
            t = handle.get_tensor(name)
            if t.dtype != torch.float16 or tuple(t.shape) != entry.shape:
                raise ModelLoadError(f"{path}: tensor {name!r} is {t.dtype} {tuple(t.shape)}, "
                                     f"{MANIFEST} says float16 {entry.shape}")
            return t
        module = name.removesuffix(".weight")
        keys = [f"{module}.{key}" for key in FORMATS[entry.format][1]]
        missing = [k for k in keys if k not in stored]
        if missing:
            raise ModelLoadError(f"{path}: tensor {missing[0]!r} is missing")
        tensors = {k.rsplit(".", 1)[1]: handle.get_tensor(k) for k in keys}
        return QuantizedTensor(entry.format, (entry.shape[0], entry.stored_k), tensors, name=module)
    except ModelLoadError:
        raise
    except QwenTrayError as e:
        raise ModelLoadError(f"{path}: {e}") from None
    except (SafetensorError, OSError, RuntimeError) as e:
        raise ModelLoadError(f"{path}: tensor {name!r} is unreadable ({e})") from None


def open_checkpoint(folder: str | Path, *, checksum: bool = True, reuse_verified: bool = True) -> Manifest:
    """Read the manifest and verify every listed file (the checks a load does; a file
    verified before and unchanged since is not hashed again unless ``reuse_verified=False``)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    verify_files(folder, manifest.files, checksum=checksum, reuse_verified=reuse_verified)
    return manifest


def dequantized_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """HF name -> fp32 tensor of what the checkpoint computes with (padding dropped).

    Saved as a plain HF folder, this is the reference model a quantized model must match.
    """
    folder = Path(folder)
    manifest = open_checkpoint(folder)
    out = {}
    for name, entry, weight in iter_weights(folder, manifest):
        if isinstance(weight, QuantizedTensor):
            out[name] = weight.dequantize(torch.float32)[:, : entry.shape[1]].contiguous()
        else:
            out[name] = weight.float()
    return out

