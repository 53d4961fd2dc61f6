"""A GGUF file -> a registered model, as a job with progress and cancel (the tray's GGUF entry).

With a recipe the GGUF is converted into a staging float16 folder and quantized into a
checkpoint that fits the GPU (what `qwen-tray models import-gguf --recipe` does); without one
the float16 folder is the model, and the result says where the tray would run it, so a model
too large for the GPU is never registered without the user being told.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from app.engine.cuda.fit import Machine
from app.errors import QwenTrayError
from app.formats.recipe import load_recipe
from app.hub.job import GotModel, fit_of, quantize_into
from app.hub.progress import CONVERTING, REGISTERING, JobProgress, RateMeter, Reporter
from app.model_folders import model_folder_lock
from app.model_import import check_free_name, register_model
from app.paths import models_dir
from app.quant.methods import DEFAULT_METHOD
from app.quant.resume import JOURNAL
from app.settings.models import check_model_name
from app.settings.store import SettingsStore


@dataclass
class ImportGgufJob:
    gguf: Path
    name: str
    recipe: str | None = "w4"  # None: keep the float16 folder
    method: str = DEFAULT_METHOD
    make_default: bool = False
    device: str | None = None
    machine: Machine | None = None
    replace: bool = False  # re-point the name when it is registered to another model
    store: SettingsStore | None = None  # the registry (default: the settings file)

    def run(self, report: Reporter, cancel: threading.Event | None = None) -> GotModel:
        name = check_model_name(self.name)
        gguf = Path(self.gguf).expanduser()
        if not gguf.is_file():
            raise QwenTrayError(f"{gguf}: no such GGUF file")
        out = models_dir() / name
        check_free_name(name, out, replace=self.replace, store=self.store)  # before the conversion
        with model_folder_lock(name):  # (which removes the fp16 staging folder a cancelled run kept)
            finished = (out / ("config.json" if self.recipe is None else "manifest.json")).is_file()
            if out.exists() and any(out.iterdir()) and not finished and not (out / JOURNAL).is_file():
                raise QwenTrayError(f"{out}: a model folder of that name exists already; choose another name")
            if not finished:
                self._convert(gguf, out, name, report, cancel)
        report(JobProgress(REGISTERING, detail=name))
        is_default = register_model(name, out, make_default=self.make_default, replace=self.replace, store=self.store)
        return GotModel(name, out, is_default, fit=fit_of(out, name, self.machine))

    def _convert(self, gguf: Path, out: Path, name: str, report: Reporter, cancel: threading.Event | None) -> None:
        """GGUF -> ``out`` (float16), or -> a staging float16 folder -> the checkpoint ``out``
        (the quantizer resumes from its journal; the staging folder is made anew each run: it
        may be of another GGUF by now)."""
        from app.engine.gguf_import import convert_gguf_to_hf

        meter = RateMeter(CONVERTING, 0, "tensor", report, cancel, folder=str(out))
        meter.detail = gguf.name

        def converted(done: int, total: int) -> None:
            meter.total = total
            meter.set(done)

        if self.recipe is None:
            convert_gguf_to_hf(gguf, out, progress=converted)
            return
        staging = models_dir() / f".{name}.fp16"
        try:
            convert_gguf_to_hf(gguf, staging, progress=converted, overwrite=True)
            quantize_into(staging, out, load_recipe(self.recipe), self.method, self.device, report, cancel, name,
                          model_id=name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
