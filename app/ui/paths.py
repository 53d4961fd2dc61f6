"""Where the tray app keeps its files: the same roots as the core (``app.paths``, which
honours ``QWEN_TRAY_HOME``), plus the shipped resources folder."""

from __future__ import annotations

from pathlib import Path

from app.paths import cache_dir, config_dir, data_dir, models_dir

__all__ = ["cache_dir", "config_dir", "data_dir", "models_dir", "resources_dir"]


def resources_dir() -> Path:
    """Shipped data files (actions.toml, icons): ``app/resources``, in a checkout and a wheel alike."""
    return Path(__file__).resolve().parent.parent / "resources"
