"""Where Qwen Tray keeps its files (platformdirs), and the one atomic write (retried on Windows
while another program holds the target open).

``QWEN_TRAY_HOME`` (when set) replaces the platformdirs roots: config, data and cache then
live in ``$QWEN_TRAY_HOME/config``, ``/data`` and ``/cache``. Tests set it so they never
touch the user's real folders.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import platformdirs

APP_NAME = "qwen-tray"
HOME_ENV = "QWEN_TRAY_HOME"
# On Windows a file cannot be replaced while another process (antivirus, the search indexer, a
# second Qwen Tray reading settings.json) has it open: such holds last a moment, so the rename is
# tried again for about a second, as pip does (pip/_internal/utils/filesystem.py).
REPLACE_RETRIES_ON_WINDOWS = sys.platform == "win32"
REPLACE_ATTEMPTS = 5
REPLACE_WAIT_S = 0.25


class FileInUseError(PermissionError):
    """The file could not be replaced although its folder is writable (the temporary file was
    written beside it): another program holds it open (Windows), or it is marked read-only."""


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


def models_dir() -> Path:
    return data_dir() / "models"


def log_file() -> Path:
    """The tray's log (it runs without a console): ``<data>/qwen-tray.log``, rotated at 1 MB."""
    return data_dir() / "qwen-tray.log"


def downloads_dir() -> Path:
    """Model sources being downloaded (app/hub): removed once quantized unless kept."""
    return data_dir() / "downloads"


def resources_dir() -> Path:
    """Shipped data files (actions.toml, icons, catalog.toml): ``app/resources``, in a checkout and a wheel alike."""
    return Path(__file__).resolve().parent / "resources"


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` so a crash leaves either the old file or the new one. The file
    is private to the user (0600, the temporary file's) unless ``mode`` says otherwise: a document
    the user exports gets what an editor would give it (0644).

    A symbolic link (a settings file kept in a dotfiles folder: stow, chezmoi, home-manager) is
    written through: the temporary file goes beside the link's target and replaces the target,
    so the link stays a link."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        replace_file(tmp, path, retry=REPLACE_RETRIES_ON_WINDOWS)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_file(src: str | Path, dst: Path, *, retry: bool, replace: Callable[..., None] | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
    """``os.replace(src, dst)``; with ``retry`` (Windows) a PermissionError is tried again for
    about a second and, if it lasts, raised as :class:`FileInUseError` naming the real cause.
    ``replace`` and ``sleep`` (os.replace, time.sleep) are looked up per call: tests replace them."""
    replace = replace or os.replace
    sleep = sleep or time.sleep
    if not retry:
        replace(src, dst)
        return
    for attempt in range(1, REPLACE_ATTEMPTS + 1):
        try:
            replace(src, dst)
            return
        except PermissionError as e:
            if attempt == REPLACE_ATTEMPTS:
                raise FileInUseError(e.errno, "it is in use by another program (or read-only)", str(dst)) from e
            sleep(REPLACE_WAIT_S)
