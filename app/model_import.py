"""A GGUF file -> a model folder under models_dir(), registered in the settings: what
``qwen-tray models add-starter`` / ``import-gguf`` and the tray's GGUF and starter entries share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.errors import QwenTrayError


def is_plain_folder_name(name: str) -> bool:
    """A model name that can be a folder of its own under models_dir() (no separators, no . / ..)."""
    return bool(name.strip()) and not any(c in name for c in "/\\:") and name.strip() not in (".", "..")


def check_model_name(name: str) -> str:
    if not is_plain_folder_name(name):
        raise QwenTrayError(f"model name {name!r} must be a plain folder name (no / \\ or :)")
    return name.strip()


def convert_gguf_into_models(gguf: Path, name: str, *, progress: Callable[[int, int], None] | None = None,
                             force: bool = False) -> Path:
    """Convert ``gguf`` into models_dir()/name unless that folder already holds a model (or ``force``)."""
    from app.engine.gguf_import import convert_gguf_to_hf
    from app.paths import models_dir

    out = models_dir() / check_model_name(name)
    if force or not (out / "config.json").is_file():
        convert_gguf_to_hf(gguf, out, progress=progress, overwrite=force)
    return out


def register_model(name: str, folder: Path, *, make_default: bool = False) -> bool:
    """Map ``name`` -> ``folder`` in the settings (``qwen-tray models list``); True if it is the default."""
    from app.settings import load_settings, save_settings

    settings = load_settings()
    if settings.models.get(name) != str(folder) or (make_default and settings.default_model != name):
        settings.add_model(name, folder, make_default=make_default)
        save_settings(settings)
    return settings.default_model == name
