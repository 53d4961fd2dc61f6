"""Fixtures for getting models: a tiny random Qwen2 published on a loopback fake hub, a user
catalog entry for it, and a private QWEN_TRAY_HOME per test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# fake_hub and hub_support are imported by name: pytest's default "prepend" import mode puts this
# folder (no __init__.py) first on the import path before it imports this conftest.
from fake_hub import FakeHub
from hub_support import TINY_REPO, catalog_toml


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


@pytest.fixture
def tiny_catalog(home, tiny_hub_model) -> Path:
    path = home / "config" / "catalog.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(catalog_toml(tiny_hub_model), encoding="utf-8")
    return path


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
