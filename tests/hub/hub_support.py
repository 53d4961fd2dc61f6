"""What the tests of getting a model share: the tiny model's names, its catalog entry, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from app.settings.store import SettingsStore

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_REPO = "tiny-org/Tiny-Qwen2"
TINY_NAME = "Tiny-Qwen2"
TINY_MODEL = "Tiny-Qwen2-w4"  # the registered name: entry name + recipe


def registered_models() -> dict[str, str]:
    """Name -> path of the registered models, as `qwen-tray models list` reads the settings file."""
    return {entry.name: entry.path for entry in SettingsStore().load().models}


def catalog_toml(tiny_hub_model: Path, name: str = TINY_NAME, repo: str = TINY_REPO, recipe: str = "w4") -> str:
    """A user catalog entry for the tiny model, its [config] taken from the model's config.json."""
    config = json.loads((tiny_hub_model / "config.json").read_text())
    lines = ["[[model]]", f'name = "{name}"', f'recipe = "{recipe}"', 'summary = "A tiny random Qwen2 for tests."',
             f'hf = {{ repo = "{repo}" }}', f'modelscope = {{ repo = "{repo}" }}', "", "[model.config]"]
    for key, value in config.items():
        if isinstance(value, (bool, int, float, str)) or (isinstance(value, list) and value):
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def qwen_tray(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """`qwen-tray ARGS` in a fresh interpreter (the env decides HF_ENDPOINT, proxies, the home)."""
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


def cli_env(home: Path, **extra: str) -> dict:
    proxies = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
    env = {k: v for k, v in os.environ.items() if k.upper() not in proxies}
    env.update(QWEN_TRAY_HOME=str(home), PYTHONPATH=str(REPO_ROOT), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    return env
