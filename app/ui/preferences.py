"""The tray's live settings: what it runs with now, saved through the one settings store.

Preferences, the model registry and the user's actions are one file (app/settings/store.py).
Each save starts from the file as it is on disk, so a model that ``qwen-tray models add``
registered while the tray runs is kept. A change applies at once; when it cannot be saved (a
read-only config folder) the tray says so and the change holds until it quits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

from app.settings.actions import Action
from app.settings.document import Settings
from app.settings.jsonfile import SettingsFileError
from app.settings.models import ModelEntry
from app.settings.notices import Notice
from app.settings.preferences import Preferences, PreferencesError
from app.settings.store import SettingsStore

NOT_SAVED = "Settings not saved: {error}. The change applies until Qwen Tray quits."


class PreferencesStore:
    """The running app's settings: change, validate, save, tell listeners (and the user)."""

    def __init__(self, path: Path | None = None):
        self._listeners: list[Callable[[Preferences], None]] = []
        self._notice_listeners: list[Callable[[Notice], None]] = []
        self._pending: list[Notice] = []
        self._told: set[str] = set()
        self._unsaved_models = False  # this run changed the registry and could not save it
        self._store = SettingsStore(path, on_notice=self._noticed)
        self.settings: Settings = self._store.load()

    @property
    def prefs(self) -> Preferences:
        return self.settings.preferences

    @property
    def path(self) -> Path:
        return self._store.path

    def subscribe(self, listener: Callable[[Preferences], None]) -> None:
        self._listeners.append(listener)

    def on_notice(self, listener: Callable[[Notice], None]) -> None:
        """``listener`` gets the notices told so far, then each new one."""
        self._notice_listeners.append(listener)
        pending, self._pending = self._pending, []
        for notice in pending:
            listener(notice)

    def refresh(self) -> Settings:
        """The settings with the registry as on disk now (a CLI command may have changed it),
        unless this run's own registry change could not be saved."""
        if not self._unsaved_models:
            fresh = self._store.load()
            self.settings.models, self.settings.default_model = fresh.models, fresh.default_model
        return self.settings

    def forget_model(self, name: str) -> Settings:
        """``name`` was unregistered on disk (a removal): gone from this run's registry too, so a
        registry change this run could not save yet does not write it back."""
        if self.settings.model(name) is not None:
            self.settings.remove_model(name)
        return self.refresh()

    def update(self, **changes) -> Preferences:
        """Apply preference ``changes`` (PreferencesError names a bad one; nothing is applied then),
        tell listeners and save; a save that fails is told as a notice."""
        try:
            self.change(**changes)
        except SettingsFileError as e:
            self._noticed(Notice(NOT_SAVED, {"error": str(e)}))
        return self.prefs

    def change(self, *, models: list[ModelEntry] | None = None, actions: list[Action] | None = None,
               **preferences) -> None:
        """Apply and save preferences, the registry and/or the user's actions in one write.

        A bad value raises (PreferencesError, ModelEntryError) before anything is applied;
        SettingsFileError after: the change holds for this run but is not on disk."""
        unknown = set(preferences) - {f.name for f in fields(Preferences)}
        if unknown:
            raise PreferencesError(f"unknown preference(s): {', '.join(sorted(unknown))}")
        prefs = Preferences(**{**self.prefs.to_dict(), **preferences})
        registry = Settings(models=list(self.settings.models), default_model=self.settings.default_model)
        if models is not None:
            registry.set_models(models)
        self.settings.preferences = prefs
        self.settings.models, self.settings.default_model = registry.models, registry.default_model
        if actions is not None:
            self.settings.actions = list(actions)
        for listener in list(self._listeners):
            listener(prefs)
        self._unsaved_models |= models is not None
        self._save()

    def _save(self) -> None:
        with self._store.edit() as on_disk:
            on_disk.preferences, on_disk.actions = self.settings.preferences, self.settings.actions
            if self._unsaved_models:
                on_disk.models, on_disk.default_model = self.settings.models, self.settings.default_model
            else:
                self.settings.models, self.settings.default_model = on_disk.models, on_disk.default_model
        self._unsaved_models = False

    def _noticed(self, notice: Notice) -> None:
        if str(notice) in self._told:
            return  # a read-only folder fails every save the same way: say it once
        self._told.add(str(notice))
        if not self._notice_listeners:
            self._pending.append(notice)
        for listener in list(self._notice_listeners):
            listener(notice)
