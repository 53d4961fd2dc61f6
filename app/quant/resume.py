"""Resuming an interrupted ``qwen-tray quantize``: the journal of finished files.

The journal (``.quantize-journal.json`` in the output folder, written atomically after each
file) holds every finished file's size and sha256, its tensors' manifest entries and a
fingerprint of the run's settings. A new run with the same settings skips the files whose
checksum still matches and redoes the rest; other settings on an unfinished folder are refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.disk_space import free_space_problem
from app.errors import ModelLoadError, QwenTrayError
from app.formats.checkpoint import (
    FORMAT_VERSION,
    JOURNAL,
    MANIFEST,
    FileEntry,
    TensorEntry,
    check_file,
    write_atomic,
)
from app.paths import models_dir
from app.quant import calibration as calib
from app.quant.gptq import GptqSettings
from app.write_failure import write_failure_reason, write_failure_remedy

CALIBRATED_METHODS = ("calibrated", "awq", "gptq")  # need a calibration text run through the model


def _file_fingerprint(path: Path) -> list:
    """Size and a hash of the part that identifies the file (a safetensors header, or all of a small file)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if path.suffix == ".safetensors":
            head = f.read(8)
            head += f.read(int.from_bytes(head, "little") if len(head) == 8 else 0)
        else:
            head = f.read(1 << 20)
    return [size, hashlib.sha256(head).hexdigest()]


def _folder_fingerprint(folder: Path) -> dict:
    names = sorted(p.name for p in folder.iterdir() if p.suffix in (".safetensors", ".json") and p.is_file())
    return {name: _file_fingerprint(folder / name) for name in names}


def fingerprint(job) -> dict:
    """Everything that changes the output: a resume with other settings must not mix files."""
    fp = {"format_version": FORMAT_VERSION, "method": job.method, "source": _folder_fingerprint(job.model),
          "recipe": {"rules": [list(r) for r in job.recipe.rules], "default_bits": job.recipe.default_bits},
          "adapter": _folder_fingerprint(job.adapter) if job.adapter else None}
    if job.method in CALIBRATED_METHODS:
        path = job.calibration or calib.default_calibration_file()
        fp["calibration"] = [_file_fingerprint(Path(path)), job.calibration_tokens]
        if job.calibration_window:  # (absent for one sequence: older journals still resume)
            fp["calibration_window"] = job.calibration_window
    if job.method == "gptq" and job.gptq != GptqSettings():  # (absent by default: older journals still resume)
        fp["gptq"] = dataclasses.asdict(job.gptq)
    return fp


# What differs between an unfinished run and this one, in the words of the options that set it.
_FIELDS = (("source", "of another source model"), ("adapter", "with another --adapter"),
           ("recipe", "with another recipe"), ("calibration", "with another calibration text or --calibration-tokens"),
           ("calibration_window", "with another calibration window"),
           ("gptq", "with other GPTQ settings (--sequential)"),
           ("format_version", "by an older version of the quantizer"))


def _difference(started: object, now: dict) -> str:
    """How the unfinished run ``started`` differs from ``now`` (fingerprints), e.g. "with --method calibrated
    (this run: gptq): run with --method calibrated to resume it"."""
    if not isinstance(started, dict):
        return "of another model, recipe or method"
    if started.get("method") != now.get("method"):
        method = started.get("method")
        return (f"with --method {method} (this run: {now.get('method')}): run with --method {method} to resume it"
                if isinstance(method, str) else "with another method")
    reasons = [words for key, words in _FIELDS if started.get(key) != now.get(key)]
    return ", ".join(reasons) or "of another model, recipe or method"


class Journal:
    """Finished files of an interrupted run, with their checksums and tensor entries."""

    def __init__(self, out: Path, fingerprint: dict):
        self.out, self.path = out, out / JOURNAL
        self.fingerprint = fingerprint
        self.files: dict[str, FileEntry] = {}
        self.tensors: dict[str, TensorEntry] = {}
        if (out / MANIFEST).exists():
            raise QwenTrayError(f"{out}: already holds a finished checkpoint; choose another --out or delete it")
        if self.path.is_file():
            self._load()
        elif out.exists() and any(out.iterdir()):
            raise QwenTrayError(f"{out}: folder is not empty and holds no unfinished quantization; choose a new --out")
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob(".*.tmp"):  # a file being written when the last run was killed
            stale.unlink()
        self._save()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            same = data["fingerprint"] == self.fingerprint
            files = {n: FileEntry(int(f["bytes"]), str(f["sha256"])) for n, f in data["files"].items()}
            tensors = {n: TensorEntry(t["file"], t["format"], tuple(t["shape"])) for n, t in data["tensors"].items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise QwenTrayError(f"{self.path}: unreadable resume journal ({e}); delete the folder and start again") from None
        if not same:
            difference = _difference(data["fingerprint"], self.fingerprint)
            raise QwenTrayError(f"{self.out}: holds an unfinished quantization {difference}; "
                                "delete it or choose another --out")
        self.files, self.tensors = files, tensors

    def finished(self, file_name: str) -> bool:
        """True if ``file_name`` was written by a previous run and its checksum still matches."""
        entry = self.files.get(file_name)
        if entry is None:
            return False
        try:
            check_file(self.out / file_name, entry)
            return True
        except ModelLoadError:
            self._forget(file_name)
            return False

    def _forget(self, file_name: str) -> None:
        self.files.pop(file_name, None)
        self.tensors = {n: t for n, t in self.tensors.items() if t.file != file_name}

    def record(self, file_name: str, entry: FileEntry, tensors: dict[str, TensorEntry]) -> None:
        self._forget(file_name)
        self.files[file_name] = entry
        self.tensors.update(tensors)
        self._save()

    def _save(self) -> None:
        data = {"fingerprint": self.fingerprint,
                "files": {n: {"bytes": f.bytes, "sha256": f.sha256} for n, f in self.files.items()},
                "tensors": {n: t.to_dict() for n, t in self.tensors.items()}}
        write_atomic(self.path, json.dumps(data, indent=1).encode("utf-8"))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def check_room_for_checkpoint(out: Path, model_id: str, checkpoint_bytes: int) -> None:
    """Refuse before the first layer when the checkpoint (less the files a resumed run already
    has) does not fit on the disk of ``out`` with the margin a download keeps."""
    try:
        done = sum(p.stat().st_size for p in out.glob("*.safetensors")) if out.is_dir() else 0
    except OSError:
        done = 0  # unreadable: writing into it says so
    problem = free_space_problem({out: checkpoint_bytes - done}, f"quantizing {model_id} into {out}")
    if problem is not None:
        raise QwenTrayError(problem)


@contextmanager
def writing_checkpoint(out: Path, journal: Journal | None) -> Iterator[None]:
    """An OSError while writing into ``out`` (a full disk, a folder not writable, a name too long)
    becomes one sentence: the folder, why, what the journal keeps and what to do."""
    try:
        yield
    except OSError as e:
        raise cannot_write_checkpoint(out, e, len(journal.files) if journal is not None else 0) from None


def cannot_write_checkpoint(out: Path, e: OSError, finished: int) -> QwenTrayError:
    app_folder = out.absolute().parent == models_dir().absolute()  # models get, import-gguf: no --out to change
    remedy = write_failure_remedy(out, e, "set QWEN_TRAY_HOME to a writable folder" if app_folder
                                  else "choose another --out")
    if finished == 0:
        kept = f"nothing was finished: {remedy}, then run the same quantization again"
    else:  # the journal has them: a run with the same settings skips them
        files = "file is" if finished == 1 else "files are"
        kept = f"its {finished} finished {files} kept: {remedy}, then running the same quantization again resumes"
    return QwenTrayError(f"cannot write the checkpoint {out}: {write_failure_reason(e)}; {kept}")
