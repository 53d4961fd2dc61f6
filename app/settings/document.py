"""Everything the settings file holds, and its JSON form (version 2).

```
{"version": 2,
 "default_model": "SmolLM2-135M-Instruct",
 "models": [{"name": "...", "kind": "local", "path": "..."},
            {"name": "...", "kind": "gguf", "path": ".../x.gguf"},
            {"name": "...", "kind": "remote", "base_url": "https://.../v1", "model": "...", "api_key": "..."}],
 "preferences": {"language": "auto", "hotkeys": {"summarize": "Ctrl+Alt+S"}, ...},
 "actions": [{"id": "user-formal", "name": "Formal", "prompt": "Make it formal: {text}", ...}]}
```

Reading is lenient, value by value (:func:`settings_from_json`): what cannot be used is left
out with a problem in words, and the rest is kept. Keys this version does not know (a newer
one's) are written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import QwenTrayError
from app.settings.actions import Action, salvage_user_action
from app.settings.models import ModelEntry, ModelEntryError, check_model_name
from app.settings.preferences import Preferences

VERSION = 2
SECTIONS = ("version", "default_model", "models", "preferences", "actions")


@dataclass(frozen=True)
class ModelLocation:
    """Where a local model's files are and the name it goes by (the engine's model id, the API's)."""
    path: Path
    name: str


@dataclass
class Settings:
    models: list[ModelEntry] = field(default_factory=list)  # the registry, in the user's order
    default_model: str | None = None  # what `ask` / `serve` use without --model; the tray's first choice
    preferences: Preferences = field(default_factory=Preferences)
    actions: list[Action] = field(default_factory=list)  # the user's own (the built-ins ship with the app)
    extra: dict[str, Any] = field(default_factory=dict)  # top-level keys from a newer version
    extra_preferences: dict[str, Any] = field(default_factory=dict)  # preference keys from a newer version

    # -- the registry ---------------------------------------------------------------------------
    def model(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)

    def add_model(self, entry: ModelEntry, *, replace: bool = False, make_default: bool = False) -> ModelEntry | None:
        """Register ``entry`` (a plain name); returns the entry it replaced. A name already taken
        by another entry is refused unless ``replace``: a name is never re-pointed silently."""
        check_model_name(entry.name)
        old = self.model(entry.name)
        if old is not None and old != entry and not replace:
            raise ModelEntryError(f"a model named {entry.name!r} is already registered ({old.describe()}); "
                                  f"pass --replace to point it at {entry.describe()}, or choose another name")
        self.models = [entry if m.name == entry.name else m for m in self.models] if old else [*self.models, entry]
        if make_default or self.default_model is None:
            self.default_model = entry.name
        return old if old != entry else None

    def set_models(self, entries: list[ModelEntry]) -> None:
        """The whole registry at once (the tray's Models page); the default stays valid."""
        names = [e.name for e in entries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ModelEntryError(f"two models are named {duplicates[0]!r}; names must be unique")
        self.models = list(entries)
        self._keep_default_valid()

    def remove_model(self, name: str) -> ModelEntry:
        """Unregister ``name`` and return its entry; if it was the default, the first local model
        left (in the order they were registered) becomes the default, else the first one, else none."""
        entry = self.model(name)
        if entry is None:
            raise ModelEntryError(f"no model named {name!r}; `qwen-tray models list` shows the registered ones")
        self.models = [m for m in self.models if m.name != name]
        self._keep_default_valid()
        return entry

    def _keep_default_valid(self) -> None:
        names = [m.name for m in self.models]
        if self.default_model not in names:
            self.default_model = next((m.name for m in self.models if m.kind == "local"), names[0] if names else None)

    def set_default(self, name: str) -> None:
        if self.model(name) is None:
            raise QwenTrayError(f"no model named {name!r}; see `qwen-tray models list`")
        self.default_model = name

    def resolve_model(self, name_or_path: str | None) -> Path:
        """A registered local model's folder, a folder path, or (None) the default model's folder."""
        return self.locate_model(name_or_path).path

    def locate_model(self, name_or_path: str | None) -> ModelLocation:
        """The folder of a registered local model, a folder path, or (None) the default model, with
        the name the model goes by: the registered name, or a plain folder's own name."""
        if name_or_path is None:
            if self.default_model is None:
                raise QwenTrayError("no model configured: run `qwen-tray models get Qwen2.5-3B-Instruct` (`models catalog` "
                                    "lists what fits this machine) or `qwen-tray models add-starter` (a small demo), "
                                    "or pass --model PATH")
            name_or_path = self.default_model
        entry = self.model(name_or_path)
        if entry is None:
            path = Path(name_or_path).expanduser()
            if path.exists():
                return ModelLocation(path, path.absolute().name or str(path))
            if name_or_path == self.default_model:
                raise QwenTrayError(f"the default model {name_or_path!r} is not registered any more: choose one with "
                                    "`qwen-tray models default NAME` (`qwen-tray models list` shows them)")
            raise QwenTrayError(f"{name_or_path}: model folder not found, and no registered model has that name "
                                "(`qwen-tray models list` shows them)")
        if entry.kind == "remote":
            raise QwenTrayError(f"model {entry.name!r} is a remote endpoint ({entry.base_url}); this command runs "
                                "local models: pass --model NAME or PATH of a local one")
        if entry.kind == "gguf":
            raise QwenTrayError(f"model {entry.name!r} is a GGUF file not converted yet: run `qwen-tray models "
                                f"import-gguf {entry.path} --name {entry.name} --force`, or load it once in the tray")
        path = Path(entry.path).expanduser()
        if not path.exists():
            raise QwenTrayError(self._missing_folder_message(entry.name, path))
        return ModelLocation(path, entry.name)

    def _missing_folder_message(self, name: str, path: Path) -> str:
        """A registered model whose folder is gone: name the entry and the ways out."""
        which = "the default model" if name == self.default_model else "model"
        others = [m.name for m in self.models if m.name != name and m.kind == "local"]
        choose = (f"choose another with `qwen-tray models default {others[0] if len(others) == 1 else 'NAME'}`, or "
                  if name == self.default_model else "")
        return (f"{which} {name!r} is registered at {path}, which is not there any more: {choose}"
                f"unregister it with `qwen-tray models remove {name}` (or put the folder back)")

    # -- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {**self.extra, "version": VERSION, "default_model": self.default_model,
                "models": [m.to_dict() for m in self.models],
                "preferences": {**self.extra_preferences, **self.preferences.to_dict()},
                "actions": [a.to_dict() for a in self.actions]}


def settings_from_json(data: dict) -> tuple[Settings, list[str]]:
    """Settings from a version-2 object (the caller checked it is an object) and the problems found."""
    problems: list[str] = []
    models = salvage_models(data.get("models", []), problems)
    default = data.get("default_model")
    if default is not None and not isinstance(default, str):
        problems.append(f"default_model must be a model's name, not {default!r}; left out")
        default = None
    preferences, extra_preferences = Preferences(), {}
    raw_preferences = data.get("preferences", {})
    if isinstance(raw_preferences, dict):
        preferences, lost, extra_preferences = Preferences.salvage(raw_preferences)
        problems += lost
    else:
        problems.append("preferences must be an object; using the defaults")
    actions = salvage_actions(data.get("actions", []), problems)
    extra = {k: v for k, v in data.items() if k not in SECTIONS}
    return Settings(models, default, preferences, actions, extra, extra_preferences), problems


def salvage_models(raw: object, problems: list[str], *, where: str = "models") -> list[ModelEntry]:
    """The usable entries of a ``models`` list; a bad entry or a repeated name is left out (a problem)."""
    if not isinstance(raw, list):
        problems.append(f"{where} must be a list; no model was read from it")
        return []
    entries: list[ModelEntry] = []
    for i, item in enumerate(raw, 1):
        try:
            entry = ModelEntry.from_dict(item)
        except ModelEntryError as e:
            problems.append(f"{where} item #{i}: {e}; left out")
            continue
        if any(e.name == entry.name for e in entries):
            problems.append(f"{where} item #{i}: a second model named {entry.name!r}; left out")
            continue
        entries.append(entry)
    return entries


def salvage_actions(raw: object, problems: list[str], *, where: str = "actions") -> list[Action]:
    if not isinstance(raw, list):
        problems.append(f"{where} must be a list; no action was read from it")
        return []
    actions: list[Action] = []
    for i, item in enumerate(raw, 1):
        action, lost = salvage_user_action(item, f"{where} item #{i}")
        problems += lost
        if action is not None:
            actions.append(action)
    return actions
