"""API keys of remote endpoints: in the OS keyring, never in settings.json where a keyring exists;
the key of the tray's Local API beside them, under an account of its own.

The keyring is a real backend (keyrings.alt's file, tests/conftest.py); "no keyring" is keyring's
own fail backend, what a bare Linux without a keyring daemon gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keyring
import keyring.backends.fail
import pytest
from keyrings.alt.file import PlaintextKeyring

from app import secrets
from app.settings.models import ModelEntry
from app.settings.store import SettingsStore

REPO = Path(__file__).resolve().parents[1]
REMOTE = {"name": "DashScope", "kind": "remote", "base_url": "https://dashscope.example/v1", "model": "qwen-plus"}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("QWEN_TRAY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _write_settings(home: Path, models: list[dict]) -> Path:
    path = home / "config" / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 2, "models": models}), encoding="utf-8")
    return path


def test_keys_in_an_old_file_move_into_the_keyring(home):
    path = _write_settings(home, [{**REMOTE, "api_key": "sk-secret"}])
    notices = []
    settings = SettingsStore(on_notice=notices.append).load()
    assert "sk-secret" not in path.read_text(encoding="utf-8")
    assert keyring.get_password("qwen-tray", "model:DashScope") == "sk-secret"
    assert settings.model("DashScope").api_key == "" and secrets.get_api_key("DashScope") == "sk-secret"
    kind, where = secrets.key_store()
    assert kind == "plain-text file"  # the tests' keyring (tests/conftest.py): said as such, not "system keyring"
    assert [str(n) for n in notices] == [f"The API keys of DashScope were moved from {path} into {where}, a "
                                         "plain-text file (keyrings.alt; not a system keyring)"]
    assert json.loads(path.read_text(encoding="utf-8"))["models"] == [REMOTE]  # the rest as it was


def test_a_new_key_goes_to_the_keyring_and_leaves_with_its_model(home):
    store = SettingsStore()
    with store.edit() as settings:
        settings.add_model(ModelEntry(**REMOTE, api_key="sk-new"))
    assert "sk-new" not in store.path.read_text(encoding="utf-8")
    assert secrets.get_api_key("DashScope") == "sk-new"
    with store.edit() as settings:
        settings.set_models([])
    assert secrets.get_api_key("DashScope") == ""


def test_without_a_keyring_the_key_stays_in_the_file_and_the_user_is_told(home):
    keyring.set_keyring(keyring.backends.fail.Keyring())
    path = _write_settings(home, [{**REMOTE, "api_key": "sk-secret"}])
    before = path.read_text(encoding="utf-8")
    notices = []
    settings = SettingsStore(on_notice=notices.append).load()
    assert settings.model("DashScope").api_key == "sk-secret"  # still usable
    assert path.read_text(encoding="utf-8") == before
    assert [str(n) for n in notices] == [
        f"The API keys of DashScope stay in {path} as plain text: no system keyring is available (the keyring "
        "package found no backend): a desktop keyring (GNOME Keyring, KWallet, KeePassXC) or `pip install "
        "keyrings.alt` provides one"]


def test_the_local_apis_key_has_an_account_of_its_own(home, test_keyring):
    secrets.set_api_key("local-api", "sk-endpoint")  # an endpoint named like the account: "model:local-api"
    secrets.set_local_api_key("tray-key")
    assert test_keyring.get_password("qwen-tray", "local-api") == "tray-key"
    assert secrets.get_local_api_key() == "tray-key" and secrets.get_api_key("local-api") == "sk-endpoint"
    secrets.set_local_api_key("")  # no key: forgotten
    assert secrets.get_local_api_key() == "" and test_keyring.get_password("qwen-tray", "local-api") is None
    secrets.set_local_api_key("")  # none stored: nothing to do
    keyring.set_keyring(keyring.backends.fail.Keyring())
    assert secrets.get_local_api_key() == ""  # no keyring: no key kept


@pytest.mark.parametrize("backend", ["keyrings.alt.file.PlaintextKeyring", "keyring.backends.fail.Keyring"])
def test_the_cli_moves_keys_or_says_why_not(home, tmp_path, backend):
    """A real `qwen-tray models list` with the keyring the environment names."""
    path = _write_settings(home, [{**REMOTE, "api_key": "sk-secret"}])
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHON_KEYRING_BACKEND": backend,
           "XDG_DATA_HOME": str(tmp_path / "xdg-data")}  # where keyrings.alt keeps its file
    done = subprocess.run([sys.executable, "-m", "app.cli", "models", "list"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "DashScope  remote https://dashscope.example/v1 (model qwen-plus)" in done.stdout
    if backend.startswith("keyrings.alt"):
        keyring_file = tmp_path / "xdg-data" / "python_keyring" / "keyring_pass.cfg"
        assert done.stderr == (f"qwen-tray: The API keys of DashScope were moved from {path} into {keyring_file}, "
                               "a plain-text file (keyrings.alt; not a system keyring)\n")
        assert "sk-secret" not in path.read_text(encoding="utf-8")
        child_keyring = PlaintextKeyring()
        child_keyring.file_path = str(tmp_path / "xdg-data" / "python_keyring" / "keyring_pass.cfg")
        assert child_keyring.get_password("qwen-tray", "model:DashScope") == "sk-secret"
    else:
        notice = f"qwen-tray: The API keys of DashScope stay in {path} as plain text: no system keyring is available"
        assert done.stderr.startswith(notice)
        assert "sk-secret" in path.read_text(encoding="utf-8")
        # Said once (README), not at every command; doctor says it again, as a report of the state.
        again = [subprocess.run([sys.executable, "-m", "app.cli", *command], env=env, capture_output=True,
                                text=True, timeout=300, cwd=REPO) for command in (["models", "list"], ["doctor"])]
        assert again[0].returncode == 0 and again[0].stderr == ""
        assert again[1].returncode == 0 and notice in again[1].stderr
