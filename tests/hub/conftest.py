"""Fixtures for getting models: a tiny random Qwen2 published on a loopback fake hub, a user
catalog entry for it, and a private QWEN_TRAY_HOME per test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # fake_hub

from fake_hub import FakeHub  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_REPO = "tiny-org/Tiny-Qwen2"
TINY_NAME = "Tiny-Qwen2"
TINY_MODEL = "Tiny-Qwen2-w4"  # the registered name: entry name + recipe


@pytest.fixture(scope="session")
def tiny_hub_model(tmp_path_factory, qwen_tokenizer_dir) -> Path:
    """The repository's files: a 2-layer random Qwen2 (K a multiple of 128, so W4 applies to every
    linear layer), its real tokenizer and generation config, ~90 MB in all."""
    from tests.conftest import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-hub-model"), qwen_tokenizer_dir, "qwen2",
                            hidden_size=128, intermediate_size=256, tie_word_embeddings=True)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("QWEN_TRAY_HOME", str(home))
    return home


@pytest.fixture
def hub(tiny_hub_model):
    fake = FakeHub()
    fake.add_repo(TINY_REPO, tiny_hub_model)
    fake.start()
    yield fake
    fake.stop()


def catalog_toml(tiny_hub_model: Path, name: str = TINY_NAME, repo: str = TINY_REPO, recipe: str = "w4") -> str:
    """A user catalog entry for the tiny model, its [config] taken from the model's config.json."""
    config = json.loads((tiny_hub_model / "config.json").read_text())
    lines = ["[[model]]", f'name = "{name}"', f'recipe = "{recipe}"', 'summary = "A tiny random Qwen2 for tests."',
             f'hf = {{ repo = "{repo}" }}', f'modelscope = {{ repo = "{repo}" }}', "", "[model.config]"]
    for key, value in config.items():
        if isinstance(value, (bool, int, float, str)) or (isinstance(value, list) and value):
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def tiny_catalog(home, tiny_hub_model) -> Path:
    path = home / "config" / "catalog.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(catalog_toml(tiny_hub_model), encoding="utf-8")
    return path


def qwen_tray(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """`qwen-tray ARGS` in a fresh interpreter (the env decides HF_ENDPOINT, proxies, the home)."""
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


def cli_env(home: Path, **extra: str) -> dict:
    proxies = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
    env = {k: v for k, v in os.environ.items() if k.upper() not in proxies}
    env.update(QWEN_TRAY_HOME=str(home), PYTHONPATH=str(REPO_ROOT), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    return env


@pytest.fixture
def run_cli(home, capsys, monkeypatch):
    """`qwen-tray ARGS` in this process, its home the test's (faster than a fresh interpreter)."""
    import io

    from app.cli import main

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))

    def run(*args: str) -> subprocess.CompletedProcess:
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run
