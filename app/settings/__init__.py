"""The one settings store (no Qt, no app.ui): the model registry, the default model, the tray's
preferences and the user's actions in ``<config>/settings.json`` (docs/ARCHITECTURE.md, Settings).

- store.py: SettingsStore (load / save / edit; notices; migration of version-1 files)
- document.py: Settings, the file's JSON form and lenient reading
- models.py, preferences.py, actions.py, keys.py: the entries and their checks
- jsonfile.py: the one atomic write and the one policy for corrupt or unreadable files
- console.py: the store as the CLI commands use it (notices printed to stderr)
"""
