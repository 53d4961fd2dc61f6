"""The tray app's own preferences (``<config>/ui-preferences.json``).

Hotkeys, per-action overrides, language, the user's model entries, local-API settings and
window geometry. The core settings (default model, model registry) belong to
``app.settings``. A file that does not parse or validate is backed up and replaced by
defaults with a notice: a broken file never stops the app from starting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from app.errors import QwenTrayError
from app.ui.actions import MODES
from app.ui.i18n import Notice
from app.ui.jsonfile import CorruptFileError, back_up_corrupt, read_json, write_json_atomic
from app.ui.models import ModelEntry, ModelEntryError
from app.ui.paths import config_dir
from app.ui.platform.keys import HotkeyError, normalize_hotkey

LANGUAGES = ("auto", "en", "zh_CN")
DEVICES = ("auto", "cpu")
MODEL_SOURCES = ("hf", "modelscope")  # app/hub/sources.py  # where local models run: the GPU when there is one, or the CPU only
FILE_NAME = "ui-preferences.json"


class PreferencesError(QwenTrayError):
    """A preference has a wrong value (names the field)."""


@dataclass
class Preferences:
    language: str = "auto"  # "auto" follows the system locale
    hotkeys: dict[str, str] = field(default_factory=dict)  # binding id -> "Ctrl+Alt+S" ("" = off); overrides
    action_modes: dict[str, str] = field(default_factory=dict)  # action id -> "popup" | "replace"; overrides
    translate_target: str = "auto"  # "auto": Chinese -> English, anything else -> Simplified Chinese
    max_tokens: int = 512  # answer length of actions and chat
    temperature: float = 0.3
    active_model: str = ""  # a ModelEntry name; "" = the first configured model
    models: list[ModelEntry] = field(default_factory=list)  # the user's own entries (local folders, remote)
    local_api_enabled: bool = False
    local_api_port: int = 18000
    device: str = "auto"  # one of DEVICES: "cpu" keeps the GPU free (games, other models)
    geometry: dict[str, str] = field(default_factory=dict)  # window name -> base64 of saveGeometry()
    model_source: str = "hf"  # where Settings -> Models downloads from: one of MODEL_SOURCES
    hf_mirror: str = ""  # a Hugging Face mirror such as https://hf-mirror.com ("" = HF_ENDPOINT or the hub)

    def __post_init__(self) -> None:
        _require(self.language in LANGUAGES, "language", f"must be one of {', '.join(LANGUAGES)}")
        _require(isinstance(self.hotkeys, dict), "hotkeys", "must be an object")
        try:
            self.hotkeys = {str(k): normalize_hotkey(str(v)) for k, v in self.hotkeys.items()}
        except HotkeyError as e:
            raise PreferencesError(f"preferences field 'hotkeys': {e}") from e
        _require(isinstance(self.action_modes, dict) and all(v in MODES for v in self.action_modes.values()),
                 "action_modes", f"values must be one of {', '.join(MODES)}")
        _require(isinstance(self.translate_target, str) and bool(self.translate_target.strip()),
                 "translate_target", "must be a language name or 'auto'")
        _require(isinstance(self.max_tokens, int) and 16 <= self.max_tokens <= 8192, "max_tokens", "must be 16..8192")
        _require(isinstance(self.temperature, (int, float)) and 0.0 <= self.temperature <= 2.0,
                 "temperature", "must be between 0 and 2")
        _require(isinstance(self.active_model, str), "active_model", "must be a string")
        _require(isinstance(self.models, list), "models", "must be a list")
        try:
            self.models = [m if isinstance(m, ModelEntry) else ModelEntry.from_dict(m) for m in self.models]
        except (ModelEntryError, TypeError) as e:
            raise PreferencesError(f"preferences field 'models': {e}") from e
        _require(isinstance(self.local_api_enabled, bool), "local_api_enabled", "must be true or false")
        _require(isinstance(self.local_api_port, int) and 1024 <= self.local_api_port <= 65535,
                 "local_api_port", "must be 1024..65535")
        _require(self.device in DEVICES, "device", f"must be one of {', '.join(DEVICES)}")
        _require(self.model_source in MODEL_SOURCES, "model_source", f"must be one of {', '.join(MODEL_SOURCES)}")
        _require(isinstance(self.hf_mirror, str) and (not self.hf_mirror or self.hf_mirror.startswith(("http://", "https://"))),
                 "hf_mirror", "must be empty or a URL starting with http:// or https://")
        _require(isinstance(self.geometry, dict) and all(isinstance(v, str) for v in self.geometry.values()),
                 "geometry", "must map window names to strings")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["models"] = [m.to_dict() for m in self.models]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Preferences:
        if not isinstance(data, dict):
            raise PreferencesError("preferences must be a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})  # unknown keys: from a newer version


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise PreferencesError(f"preferences field {name!r}: {message}")


def preferences_path() -> Path:
    return config_dir() / FILE_NAME


def load_preferences(path: Path | None = None) -> tuple[Preferences, Notice | None]:
    """The saved preferences, or defaults plus a one-line notice when the file was broken."""
    path = path or preferences_path()
    try:
        data = read_json(path)
        if data is None:
            return Preferences(), None
        return Preferences.from_dict(data), None
    except (CorruptFileError, PreferencesError) as e:
        backup = back_up_corrupt(path)
        return Preferences(), Notice(
            "Preferences were unreadable and have been reset to defaults; the old file is {backup} ({error})",
            {"backup": str(backup), "error": str(e)})


def save_preferences(prefs: Preferences, path: Path | None = None) -> None:
    write_json_atomic(path or preferences_path(), prefs.to_dict())


class PreferencesStore:
    """The live preferences of the running app: change, validate, save, tell listeners."""

    def __init__(self, path: Path | None = None):
        self.path = path or preferences_path()
        self.prefs, self.notice = load_preferences(self.path)
        self._listeners: list = []

    def subscribe(self, listener) -> None:
        self._listeners.append(listener)

    def update(self, **changes) -> Preferences:
        """Apply ``changes`` (validated like a fresh load: PreferencesError names a bad field), save, notify."""
        data = self.prefs.to_dict()
        unknown = set(changes) - {f.name for f in fields(Preferences)}
        if unknown:
            raise PreferencesError(f"unknown preference(s): {', '.join(sorted(unknown))}")
        data.update(changes)
        self.prefs = Preferences.from_dict(data)
        save_preferences(self.prefs, self.path)
        for listener in list(self._listeners):
            listener(self.prefs)
        return self.prefs
