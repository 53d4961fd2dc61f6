"""Getting a model: download -> quantize -> register (-> remove the source), one resumable job.

Used by `qwen-tray models get` in a terminal and by the tray on a worker thread; both report
through :class:`~app.hub.progress.JobProgress` and can cancel. Every step resumes: the download
from its ``.part`` files, the quantizer from its journal; a finished checkpoint is only
registered again. Nothing is registered before the checkpoint's manifest is written, so a
partial download or quantization never shows up as a model.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from app.engine.cuda.fit import Fit, Machine, folder_weights, model_fit
from app.errors import QwenTrayError
from app.formats.recipe import Recipe, load_recipe
from app.hub.catalog import CatalogEntry, RepoRef
from app.hub.disk import check_free_space
from app.hub.download import PART_SUFFIX, STATE_FILE, SnapshotDownload, downloaded_bytes, is_complete
from app.hub.errors import HubError, HubNotFoundError, HubUnreachableError, keeping_download
from app.hub.plan import plan_entry
from app.hub.progress import CHECKING, QUANTIZING, REGISTERING, JobProgress, RateMeter, Reporter
from app.hub.sources import make_source
from app.model_folders import folder_bytes, model_folder_lock
from app.model_import import check_free_name, register_model
from app.paths import cache_dir, downloads_dir, models_dir
from app.quant.device import resolve_quantize_device
from app.quant.methods import DEFAULT_METHOD
from app.settings.store import SettingsStore

log = logging.getLogger(__name__)
UNKNOWN_CHECKPOINT_FRACTION = 0.35  # an entry without [config]: a W4 checkpoint is ~30 % of bf16
REMOVE_RETRY_WAIT_S = 1.0  # a virus scan of a just-written file lets go within a moment


@dataclass(frozen=True)
class GotModel:
    name: str  # the registered name
    path: Path  # the checkpoint (or float16) folder
    is_default: bool
    source_kept: Path | None = None  # the downloaded source, when kept
    fit: Fit | None = None  # where the tray would run it (None without a machine)
    source_left: Path | None = None  # the download, when some of it could not be deleted
    source_left_bytes: int = 0  # what remains of it


def quantize_into(source: Path, out: Path, recipe: Recipe, method: str, device: str | None, report: Reporter,
                  cancel: threading.Event | None, label: str, model_id: str) -> None:
    """Quantize ``source`` into ``out`` (resuming an interrupted run), layer by layer with progress;
    ``model_id`` names the model in the manifest (`checkpoint info`)."""
    import torch

    from app.quant.quantizer import QuantizeJob, quantize_model

    device = resolve_quantize_device(device, source, method)
    meter = RateMeter(QUANTIZING, 0, "layer", report, cancel, folder=str(out))

    def progress(unit: str, done: int, total: int) -> None:
        meter.total = meter.files = total
        meter.set(done, detail=f"{label} on the {'GPU' if device == 'cuda' else 'CPU'}: {unit}")

    def resumed(done: int, total: int, *, say: bool = True) -> None:
        # the files an earlier run finished are not this run's work: the rate and ETA start from them
        meter.total = meter.files = total
        meter.start_at(done)
        if say:  # as `quantize` says it
            meter.tell(f"resuming: {done} of {total} files are already done")

    job = QuantizeJob(model=source, out=out, recipe=recipe, method=method, device=device, model_id=model_id)
    try:
        quantize_model(job, progress, on_resume=resumed)
    except torch.cuda.OutOfMemoryError:
        if device != "cuda":
            raise
        log.warning("the GPU ran out of memory while quantizing %s; going on on the CPU", label)
        torch.cuda.empty_cache()
        device = job.device = "cpu"
        # the journal keeps the layers the GPU finished (the warning above said why it goes on)
        quantize_model(job, progress, on_resume=lambda done, total: resumed(done, total, say=False))


def fit_of(folder: Path, name: str, machine: Machine | None) -> Fit | None:
    if machine is None:
        return None
    spec, weights, kind = folder_weights(folder)
    return model_fit(spec, weights, quantized=kind.endswith("checkpoint"), machine=machine, label=name)


@dataclass
class GetModelJob:
    """`qwen-tray models get NAME`: one catalog entry, from a source, quantized with a recipe."""

    entry: CatalogEntry
    source: str = "hf"
    recipe: str | None = None  # default: the entry's
    method: str = DEFAULT_METHOD
    keep_source: bool = False
    make_default: bool = False
    endpoint: str | None = None  # a mirror of the hub, or another ModelScope endpoint
    device: str | None = None  # where to quantize; None or "auto": the GPU if it has room
    machine: Machine | None = None  # for the verdict on where the tray will run it
    replace: bool = False  # re-point the name when it is registered to another model
    force: bool = False  # quantize again even if a checkpoint of the name exists (as import-gguf's --force)
    store: SettingsStore | None = None  # the registry (default: the settings file)

    @property
    def name(self) -> str:
        return self.entry.model_name(self.recipe)

    @property
    def out(self) -> Path:
        return models_dir() / self.name

    @property
    def source_folder(self) -> Path:
        return downloads_dir() / f"{self.entry.name}.{self.source}"

    def run(self, report: Reporter, cancel: threading.Event | None = None) -> GotModel:
        """The whole job, while no other process (a second `models get`, the tray's Get a
        model) works on the same model: the second one is told so, not let loose on the
        first one's partial files."""
        path = cache_dir() / "locks" / f"get-{self.entry.name}.lock"
        lock = FileLock(path, timeout=0)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:
            raise HubError(f"{self.entry.name} is being fetched by another qwen-tray process (a `models get`, or "
                           "the tray's Get a model); wait for it to finish, or stop it and run this again") from None
        except OSError as e:  # no lock where the cache cannot be written: the job itself may still work
            log.warning("%s: not locked (%s)", path, e)
            return self._run(report, cancel)
        try:
            return self._run(report, cancel)
        finally:
            lock.release()

    def downloaded_bytes(self) -> int:
        """What the download has on disk so far (kept for the next run)."""
        return downloaded_bytes(self.source_folder)

    def _run(self, report: Reporter, cancel: threading.Event | None) -> GotModel:
        report(JobProgress(CHECKING, detail=self.name))
        # a wrong --recipe is the user's, said as `quantize` says it, before anything is fetched
        recipe = load_recipe(self.recipe or self.entry.recipe)
        check_free_name(self.name, self.out, replace=self.replace, store=self.store)  # before the download
        with model_folder_lock(self.name):  # (and what a killed conversion of this name left goes)
            if not self._has_checkpoint(recipe):
                self._fetch(report, cancel)
                quantize_into(self.source_folder, self.out, recipe, self.method, self.device, report, cancel,
                              self.name, model_id=self.entry.ref(self.source).repo)
        report(JobProgress(REGISTERING, detail=self.name))
        is_default = register_model(self.name, self.out, make_default=self.make_default, replace=self.replace,
                                    store=self.store)
        kept = self.source_folder if self.keep_source and self.source_folder.is_dir() else None
        left = None if kept is not None else remove_download(self.source_folder)
        return GotModel(self.name, self.out, is_default, kept, fit_of(self.out, self.name, self.machine),
                        source_left=left, source_left_bytes=folder_bytes(left) if left is not None else 0)

    def _has_checkpoint(self, recipe: Recipe) -> bool:
        """Whether ``out`` holds the finished checkpoint asked for: then it is only registered
        again. One made with another method or other recipe rules (finished, or unfinished and
        so refused by the quantizer's journal) is refused in one line, unless ``force``; with
        ``force`` a finished one is quantized again, and an unfinished one made as asked resumes
        (so the same command run again after an interruption goes on where it stopped)."""
        made = made_with(self.out)
        if made is None:
            return False
        method, made_recipe, finished = made
        same = method == self.method and same_rules(made_recipe, recipe)
        if same and finished and not self.force:
            return True
        if not same and not self.force:
            raise QwenTrayError(self._made_another_way(method, made_recipe, recipe, finished))
        if finished or not same:
            log.info("%s: quantizing again (--force)", self.out)
            shutil.rmtree(self.out)
        return False

    def _made_another_way(self, method: str, made: Recipe, asked: Recipe, finished: bool) -> str:
        """One line: what ``out`` was made with, what was asked, and how to go on."""
        made_as, asked_as = [], []
        if method != self.method:
            made_as.append(f"--method {method}")
            asked_as.append(f"--method {self.method}")
        if not same_rules(made, asked):
            made_as.append(f"recipe {made.name!r} of other rules" if finished else "other recipe rules")
            file = self.recipe and Path(self.recipe).is_file()
            asked_as.append(f"{self.recipe} as it reads now" if file else f"recipe {asked.name!r}")
        what = "a checkpoint" if finished else "an unfinished quantization"
        go_on = "to use it as it is" if finished else "to resume it"
        use = f", or {made_as[0]} {go_on}" if method != self.method and same_rules(made, asked) else ""
        return (f"{self.out} holds {what} of {self.name} made with {' and '.join(made_as)} (asked: "
                f"{' and '.join(asked_as)}); pass --force to quantize it again as asked{use}")

    def _fetch(self, report: Reporter, cancel: threading.Event | None) -> None:
        folder = self.source_folder
        if is_complete(folder):
            return
        source = make_source(self.source, self.endpoint)
        try:
            snapshot = self._snapshot(source)
            download = SnapshotDownload(snapshot, folder)
            check_free_space({folder: download.remaining_bytes(), self.out: self._checkpoint_bytes(snapshot)},
                             f"{self.name} (the download and its checkpoint)")
            download.run(report, cancel)
        except HubUnreachableError as e:
            self._drop_empty_download()
            raise keeping_download(e.located(self.source, source.custom_endpoint), self.downloaded_bytes()) from None
        except HubError as e:
            self._drop_empty_download()
            raise keeping_download(e, self.downloaded_bytes()) from None
        except BaseException:  # a cancel, Ctrl+C, a bug: the same
            self._drop_empty_download()
            raise

    def _drop_empty_download(self) -> None:
        """Remove the download folder when it holds nothing worth resuming: a get refused before its
        first byte (a gated repo's 401, a missing file's 404) left only its state and an empty
        .part, which no command could reach (nothing was registered). Any byte or finished file
        stays for the next run."""
        folder = self.source_folder
        if not folder.is_dir() or self.downloaded_bytes() > 0:
            return
        if any(p.is_file() and p.name != STATE_FILE and not p.name.endswith(PART_SUFFIX) for p in folder.rglob("*")):
            return  # a finished (empty) file
        shutil.rmtree(folder, ignore_errors=True)

    def _snapshot(self, source):
        """The listing at the commit an earlier run of this download started from, if any (so
        its files stay one snapshot), else at the catalog's revision."""
        ref = self.entry.ref(self.source)
        started = _started_revision(self.source_folder, self.source, ref.repo)
        if started and started != ref.revision:
            try:
                return source.snapshot(RepoRef(ref.repo, started), self.entry.files)
            except HubNotFoundError:
                log.info("%s: revision %s is gone; starting from %s", ref.repo, started, ref.revision)
        return source.snapshot(ref, self.entry.files)

    def _checkpoint_bytes(self, snapshot) -> int:
        planned = plan_entry(self.entry, None, self.recipe).checkpoint_bytes
        if planned is not None:
            return planned
        weights = sum(f.size for f in snapshot.files if f.path.endswith(".safetensors"))
        return int(weights * UNKNOWN_CHECKPOINT_FRACTION)


def remove_download(folder: Path) -> Path | None:
    """Delete a download whose checkpoint is registered; return ``folder`` if some of it stays.

    On Windows a file that is open or memory-mapped cannot be deleted: a safetensors mapping of
    the quantizer not yet collected, an antivirus scanning the new gigabytes. The mappings of
    this process go with a garbage collection, a scan with a moment's wait; what still fails is
    returned for the caller to say, not swallowed (it can be gigabytes)."""
    if not folder.exists():
        return None  # a checkpoint that was only registered again: nothing was downloaded
    failed: list[str] = []
    for attempt in range(2):
        if attempt:
            time.sleep(REMOVE_RETRY_WAIT_S)
        failed.clear()
        gc.collect()
        _rmtree_noting(folder, failed)
        if not failed:
            return None
    log.warning("%s: could not delete %s", folder, ", ".join(failed[:3]) + (" ..." if len(failed) > 3 else ""))
    return folder if folder.exists() else None


def _rmtree_noting(folder: Path, failed: list[str]) -> None:
    """shutil.rmtree that goes on past a file it cannot delete and notes its path in ``failed``."""
    def note(_function, path, exc) -> None:
        error = exc[1] if isinstance(exc, tuple) else exc  # onerror's exc_info, onexc's exception
        if not isinstance(error, FileNotFoundError):  # gone already (or never downloaded): fine
            failed.append(str(path))

    if sys.version_info >= (3, 12):
        shutil.rmtree(folder, onexc=note)
    else:  # onexc is new in 3.12, where onerror is deprecated
        shutil.rmtree(folder, onerror=note)


def made_with(folder: Path) -> tuple[str, Recipe, bool] | None:
    """(method, recipe, finished) of the checkpoint in ``folder``, from its manifest, or from the
    journal of an unfinished quantization; None when it holds neither."""
    from app.formats.checkpoint import MANIFEST, read_manifest
    from app.quant.resume import JOURNAL

    if (folder / MANIFEST).is_file():
        try:
            manifest = read_manifest(folder)
        except QwenTrayError as e:
            raise QwenTrayError(f"{e}; pass --force to quantize it again") from None
        return manifest.method, manifest.recipe, True
    try:
        started = json.loads((folder / JOURNAL).read_text(encoding="utf-8"))["fingerprint"]
        rules = tuple((str(p), int(b)) for p, b in started["recipe"]["rules"])
        return str(started["method"]), Recipe("unfinished", rules, int(started["recipe"]["default_bits"])), False
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: the quantizer's journal says so in its own words


def same_rules(a: Recipe, b: Recipe) -> bool:
    """Whether two recipes quantize alike (their names aside: a file's name is its stem)."""
    return tuple(map(tuple, a.rules)) == tuple(map(tuple, b.rules)) and a.default_bits == b.default_bits


def _started_revision(folder: Path, source: str, repo: str) -> str | None:
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(state, dict) and state.get("source") == source and state.get("repo") == repo:
        return state.get("revision") or None
    return None
