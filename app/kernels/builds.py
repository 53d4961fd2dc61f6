"""The kernels a load builds, told as progress: how many, and whether NVRTC compiles them.

Each kernel instance is compiled on its first use (app.kernels.loader) and CuPy keeps the
result on disk, so a model's first load on a machine, or the first after the kernels
changed, compiles them all (tens of seconds on a laptop) and later loads take them from
CuPy's cache in milliseconds. To tell one from the other ahead, and to show a percentage,
the instances a load built are recorded in ``<cache>/kernels/built-<key>.json``; the key
hashes the kernel sources, the compile options, the GPU's architecture and CuPy's version
(what CuPy's own cache key holds). A load whose key has a record expects that many
instances, from the cache; one without is a first build, expecting as many as the newest
record of any key, or :data:`FIRST_BUILD_ESTIMATE` on a machine that never built one. The
percentage of a guessed total stops short of 100 until the build is done.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from app.kernels import loader
from app.paths import atomic_write_text, cache_dir
from app.progress import GPU_STAGE, KERNELS_STAGE

log = logging.getLogger(__name__)

# Kernel instances a first build compiles when no build was recorded here yet: a Qwen2.5 3B `w4`
# load counts 14, the 7B `mixed` 12 (docs/results/first_load_h200.json's counts plus the two
# tile repack kernels; the two dequantization kernels are built before the count starts).
FIRST_BUILD_ESTIMATE = 14
Progress = Callable[[str, int, int], None]


def records_dir() -> Path:
    return cache_dir() / "kernels"


def build_key(capability: tuple[int, int], cupy_version: str) -> str:
    """What decides whether CuPy's cache holds a kernel: the sources, options, GPU and compiler."""
    digest = hashlib.sha256()
    for path in sorted(loader.KERNEL_DIR.glob("*.cu")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(repr((loader.COMPILE_OPTIONS, capability, cupy_version)).encode())
    return digest.hexdigest()[:16]


@dataclass
class BuildRecord:
    """The instances the last load with ``key`` built (``instances`` None: no such load yet)."""

    key: str
    instances: list[str] | None
    folder: Path

    @classmethod
    def read(cls, key: str, folder: Path | None = None) -> BuildRecord:
        folder = folder or records_dir()
        return cls(key, _read_instances(folder / f"built-{key}.json"), folder)

    @property
    def cached(self) -> bool:
        return self.instances is not None

    def expected(self) -> int:
        """Instances this load will build: its record's, else the newest record's, else the estimate."""
        if self.instances is not None:
            return max(1, len(self.instances))
        others = sorted(self.folder.glob("built-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for path in others:
            instances = _read_instances(path)
            if instances:
                return len(instances)
        return FIRST_BUILD_ESTIMATE

    def save(self, built: list[str]) -> None:
        """Remember what this load built, with what an earlier load under the same key built."""
        instances = sorted(set(self.instances or ()) | set(built))
        try:
            atomic_write_text(self.folder / f"built-{self.key}.json", json.dumps({"instances": instances}, indent=1))
        except OSError as e:  # only the next load's progress is less precise
            log.warning("cannot record the kernels built in %s: %s", self.folder, e)
        self.instances = instances


def _read_instances(path: Path) -> list[str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: the same as never built
        return None
    instances = data.get("instances") if isinstance(data, dict) else None
    return [str(i) for i in instances] if isinstance(instances, list) else None


class BuildProgress:
    """Turns the instances built (:func:`app.kernels.loader.watch_builds`) into progress calls."""

    def __init__(self, record: BuildRecord, progress: Progress | None):
        self.record, self.progress = record, progress
        self.total = record.expected()
        self.stage = GPU_STAGE if record.cached else KERNELS_STAGE  # (for the whole load)
        self.built: list[str] = []

    def start(self) -> None:
        self._tell(0)

    def __call__(self, filename: str, name_expression: str) -> None:
        self.built.append(f"{filename}:{name_expression}")
        self._tell(min(len(self.built), self.total - 1))  # a guess is not done until finish()

    def finish(self) -> None:
        self.record.save(self.built)
        self._tell(self.total)

    def _tell(self, done: int) -> None:
        if self.progress is not None:
            self.progress(self.stage, done, self.total)


@contextmanager
def kernel_builds(device: torch.device, progress: Progress | None) -> Iterator[BuildProgress | None]:
    """Around the build of a CUDA runner: its kernels' progress, then the record of what it built."""
    if device.type != "cuda" or not loader.available():
        yield None
        return
    watcher = BuildProgress(BuildRecord.read(_current_key(device)), progress)
    watcher.start()
    with loader.watch_builds(watcher):
        yield watcher
    watcher.finish()


def _current_key(device: torch.device) -> str:
    return build_key(torch.cuda.get_device_capability(device), _cupy_version())


def _cupy_version() -> str:
    for name in ("cupy-cuda12x", "cupy-cuda13x", "cupy"):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"
