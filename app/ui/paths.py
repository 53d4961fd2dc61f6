"""Where the tray app keeps its files.

``QWEN_TRAY_HOME`` (when set) replaces the platformdirs roots: config, data and cache then
live in ``$QWEN_TRAY_HOME/config``, ``/data`` and ``/cache``. Tests set it so they never touch
the user's real folders; the core settings module honours the same variable.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "qwen-tray"
HOME_ENV = "QWEN_TRAY_HOME"


def _root(kind: str) -> Path:
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home) / kind
    if kind == "config":
        return Path(platformdirs.user_config_dir(APP_NAME, appauthor=False))
    if kind == "data":
        return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def config_dir() -> Path:
    return _root("config")


def data_dir() -> Path:
    return _root("data")


def cache_dir() -> Path:
    return _root("cache")


def resources_dir() -> Path:
    """Shipped data files (actions.toml, icons): ``app/resources`` in a wheel, ``resources/`` in a checkout."""
    package_root = Path(__file__).resolve().parent.parent
    for candidate in (package_root / "resources", package_root.parent / "resources"):
        if (candidate / "actions.toml").is_file():
            return candidate
    return package_root.parent / "resources"
