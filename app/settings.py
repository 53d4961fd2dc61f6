"""Core settings: the registered models and which one is the default.

Stored as JSON in the platformdirs config folder (``settings.json``), written atomically.
A corrupt file is moved aside (``settings.json.corrupt-<time>``) and replaced by defaults,
with a warning: never a crash, never silently lost.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import QwenTrayError
from app.paths import atomic_write_text, config_dir

log = logging.getLogger(__name__)
SETTINGS_VERSION = 1


@dataclass
class Settings:
    default_model: str | None = None
    models: dict[str, str] = field(default_factory=dict)  # name -> folder
    notice: str | None = field(default=None, compare=False)  # set when the file was reset

    def __post_init__(self) -> None:
        if not isinstance(self.models, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in self.models.items()):
            raise ValueError("models must map names to folder paths")
        if self.default_model is not None and not isinstance(self.default_model, str):
            raise ValueError("default_model must be a string")

    def add_model(self, name: str, path: Path, make_default: bool = False) -> None:
        self.models[name] = str(path)
        if make_default or self.default_model is None:
            self.default_model = name

    def resolve_model(self, name_or_path: str | None) -> Path:
        """A registered name, a folder path, or (None) the default model."""
        if name_or_path is None:
            if self.default_model is None:
                raise QwenTrayError("no model configured: run `qwen-tray models add-starter` or pass --model PATH")
            name_or_path = self.default_model
        if name_or_path in self.models:
            return Path(self.models[name_or_path])
        return Path(name_or_path).expanduser()


def settings_path() -> Path:
    return config_dir() / "settings.json"


def load_settings(path: Path | None = None) -> Settings:
    path = path or settings_path()
    if not path.exists():
        return Settings()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return Settings(default_model=raw.get("default_model"), models=dict(raw.get("models", {})))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError) as e:
        backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        path.replace(backup)
        notice = f"{path}: unreadable settings ({e}); moved to {backup.name} and reset to defaults"
        log.warning(notice)
        return Settings(notice=notice)


def save_settings(settings: Settings, path: Path | None = None) -> None:
    data = {"version": SETTINGS_VERSION, "default_model": settings.default_model, "models": settings.models}
    atomic_write_text(path or settings_path(), json.dumps(data, indent=2, ensure_ascii=False) + "\n")
