"""A GGUF file -> a model folder under models_dir(), registered in the settings: what
``qwen-tray models add-starter`` / ``import-gguf`` and the tray's GGUF and starter entries share;
and the check of a model folder registered as it is (``models add``, Settings → Models → Add)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.errors import QwenTrayError
from app.model_folders import model_folder_lock
from app.paths import models_dir
from app.settings.models import ModelEntry, check_model_name
from app.settings.store import SettingsStore


def convert_gguf_into_models(gguf: Path, name: str, *, progress: Callable[[int, int], None] | None = None,
                             force: bool = False, check_space: Callable[[Path, Path], None] | None = None) -> Path:
    """Convert ``gguf`` into models_dir()/name unless that folder already holds a model (or ``force``).
    ``check_space(gguf, out)``: raises when the disk has no room for the conversion (app.hub.disk)."""
    from app.engine.gguf_import import convert_gguf_to_hf

    out = models_dir() / check_model_name(name)
    with model_folder_lock(out.name):
        if force or not (out / "config.json").is_file():
            if check_space is not None:
                check_space(gguf, out)
            convert_gguf_to_hf(gguf, out, progress=progress, overwrite=force)
    return out


def check_free_name(name: str, folder: Path, *, replace: bool = False, store: SettingsStore | None = None) -> None:
    """Refuse (ModelEntryError) a name registered to something other than ``folder``, unless
    ``replace``: asked before the slow work (a download, a conversion), so it is not wasted."""
    settings = (store or SettingsStore()).load()
    settings.add_model(ModelEntry(name=name, kind="local", path=str(folder)), replace=replace)


def register_model(name: str, folder: Path, *, make_default: bool = False, replace: bool = False,
                   store: SettingsStore | None = None) -> bool:
    """Register ``name`` -> local ``folder`` (``qwen-tray models list``); True if it is the default.

    A name registered to something else is refused (ModelEntryError) unless ``replace``."""
    with (store or SettingsStore()).edit() as settings:
        settings.add_model(ModelEntry(name=name, kind="local", path=str(folder)), replace=replace,
                           make_default=make_default)
        return settings.default_model == name


def check_model_folder(path: Path) -> None:
    """A folder ``ask`` could load: a readable config.json of a supported model, or a checkpoint manifest."""
    from app.formats import checkpoint
    from app.formats.spec import ModelSpec

    if path.is_file() and path.suffix.lower() == ".gguf":
        raise QwenTrayError(f"{path}: a GGUF file, not a model folder: add it with `qwen-tray models import-gguf {path}`")
    if path.is_file():
        raise QwenTrayError(f"{path}: not a folder (give the model's folder)")
    if not path.is_dir():
        raise QwenTrayError(f"{path}: no such folder")
    if checkpoint.is_checkpoint(path):
        checkpoint.read_manifest(path)
    elif (path / "config.json").is_file():
        ModelSpec.from_hf_folder(path)
    else:
        raise QwenTrayError(f"{path}: not a model folder (no config.json or manifest.json)")
