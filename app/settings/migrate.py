"""Version 1's three files into one version-2 settings document.

Version 1 kept, in the config folder:

- ``settings.json``: ``{"version": 1, "default_model": NAME, "models": {NAME: FOLDER}}``, the
  CLI's registry of local folders;
- ``ui-preferences.json``: the tray's preferences, with its remote and GGUF models under
  ``models`` (a name the CLI's registry also had was hidden by it, and still is);
- ``actions.json``: the user's actions, a list.

Each value is read as leniently as a version-2 file (app/settings/document.py).
"""

from __future__ import annotations

from app.settings.document import Settings, salvage_actions, salvage_models
from app.settings.models import ModelEntry, ModelEntryError
from app.settings.preferences import Preferences

PREFERENCES_V1 = "ui-preferences.json"
ACTIONS_V1 = "actions.json"


def is_version_1(data: dict) -> bool:
    """Version 1 said so, and its ``models`` was a name -> folder map (a file edited by hand
    without a version is taken for the current version unless its models say otherwise)."""
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool):
        return version < 2
    return isinstance(data.get("models"), dict)


def settings_from_v1(core: dict | None, preferences: object, actions: object) -> tuple[Settings, dict[str, list[str]]]:
    """Settings from the parsed v1 files (None: the file was missing); problems per file name."""
    problems: dict[str, list[str]] = {"settings.json": [], PREFERENCES_V1: [], ACTIONS_V1: []}
    settings = Settings()
    if core is not None:
        settings.models = _core_models(core.get("models", {}), problems["settings.json"])
        default = core.get("default_model")
        if isinstance(default, str) or default is None:
            settings.default_model = default
        else:
            problems["settings.json"].append(f"default_model must be a model's name, not {default!r}; left out")
    if preferences is not None:
        if isinstance(preferences, dict):
            tray_models = salvage_models(preferences.get("models", []), problems[PREFERENCES_V1])
            settings.models += [m for m in tray_models if settings.model(m.name) is None]
            rest = {k: v for k, v in preferences.items() if k != "models"}
            settings.preferences, lost, settings.extra_preferences = Preferences.salvage(rest)
            problems[PREFERENCES_V1] += lost
        else:
            problems[PREFERENCES_V1].append("the preferences must be an object; using the defaults")
    if actions is not None:
        settings.actions = salvage_actions(actions, problems[ACTIONS_V1], where="actions")
    return settings, {name: found for name, found in problems.items() if found}


def _core_models(raw: object, problems: list[str]) -> list[ModelEntry]:
    if not isinstance(raw, dict):
        problems.append("models must map names to folders; no model was read from it")
        return []
    entries = []
    for name, path in raw.items():
        try:
            if not isinstance(path, str):
                raise ModelEntryError(f"model {name!r}: the folder must be a string")
            entries.append(ModelEntry(name=name, kind="local", path=path))
        except ModelEntryError as e:
            problems.append(f"{e}; left out")
    return entries
