"""Fixtures for the tray-app tests: a private QWEN_TRAY_HOME per test, Qt offscreen."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# ui_fakes and ui_x11_driver are imported by name: pytest's default "prepend" import mode puts this folder
# (no __init__.py) first on the import path before it imports this conftest.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def ui_home(tmp_path, monkeypatch) -> Path:
    """Config/data/cache of the app under this test's own temporary folder; the desktop's own
    folders (XDG autostart entries, installed icons) too."""
    home = tmp_path / "qwen-tray-home"
    monkeypatch.setenv("QWEN_TRAY_HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.delenv("QWEN_TRAY_API_KEY", raising=False)  # the Local API's key: not the developer's
    return home


@pytest.fixture(scope="module")
def xdisplay():
    """A private X server (Xvfb) for the tests of one module; skips them where the tools are missing."""
    from ui_x11_display import private_display

    with private_display() as display:
        yield display


@pytest.fixture(autouse=True)
def english_ui():
    """UI text (ours and Qt's own) in English unless a test switches it."""
    from PySide6.QtWidgets import QApplication

    from app.ui.i18n import install_qt_translation, set_language

    set_language("en")
    yield
    set_language("en")
    if QApplication.instance() is not None:
        install_qt_translation(QApplication.instance())


@pytest.fixture(scope="session")
def qwen_token_counter(qwen_tokenizer_dir):
    """Token counting with Qwen's real tokenizer (what the local engine's tokenizer does)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(qwen_tokenizer_dir / "tokenizer.json"))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
