"""The one settings store (app/settings): what it keeps, how it survives broken, unreadable and
read-only files, and how it moves version-1 files into one. The CLI's side: tests/test_cli_settings.py."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from app.secrets import get_api_key
from app.settings.actions import Action
from app.settings.document import Settings
from app.settings.jsonfile import SettingsFileError, keep_aside
from app.settings.models import ModelEntry, ModelEntryError, check_model_name
from app.settings.preferences import Preferences, PreferencesError
from app.settings.store import SettingsStore, settings_path
from tests.unprivileged import run

LOCAL = ModelEntry("Qwen2.5-3B w4", path="/models/qwen2.5-3b-w4")
GGUF = ModelEntry("Tiny", kind="gguf", path="/downloads/tiny.gguf")
REMOTE = ModelEntry("DashScope", kind="remote", base_url="https://dashscope.example.com/v1", model="qwen-plus",
                    api_key="sk-1")
FORMAL = Action(id="user-formal", name="Formal", prompt="Make it formal: {text}", hotkey="ctrl+alt+f")


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("QWEN_TRAY_HOME", str(tmp_path))
    return tmp_path / "config"


def load() -> tuple[Settings, list[str]]:
    store = SettingsStore()
    settings = store.load()
    return settings, [str(n) for n in store.take_notices()]


def write(path: Path, content: str | dict | list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")


def test_everything_round_trips_in_one_human_readable_file(config):
    with SettingsStore().edit() as settings:
        for entry in (LOCAL, GGUF, REMOTE):
            settings.add_model(entry)
        settings.set_default("DashScope")
        settings.preferences = Preferences(language="zh_CN", hotkeys={"summarize": "alt+ctrl+q"}, device="cpu")
        settings.actions = [FORMAL]
    assert [p.name for p in config.iterdir()] == ["settings.json"]
    data = json.loads(settings_path().read_text(encoding="utf-8"))
    assert data["version"] == 2 and data["default_model"] == "DashScope"
    assert data["models"][0] == {"name": LOCAL.name, "kind": "local", "path": LOCAL.path}  # no noise to edit around
    assert data["actions"] == [{"id": "user-formal", "name": "Formal", "prompt": "Make it formal: {text}",
                                "hotkey": "Ctrl+Alt+F"}]
    assert "sk-1" not in settings_path().read_text(encoding="utf-8")  # the API key is in the keyring
    settings, notices = load()
    assert notices == []
    assert settings.models == [LOCAL, GGUF, replace(REMOTE, api_key="")] and settings.default_model == "DashScope"
    assert get_api_key("DashScope") == "sk-1"
    assert settings.preferences.hotkeys == {"summarize": "Ctrl+Alt+Q"} and settings.actions == [FORMAL]


def test_a_name_is_never_re_pointed_silently(config):
    settings = Settings()
    settings.add_model(LOCAL)
    settings.add_model(LOCAL)  # the same entry again: nothing to say
    moved = ModelEntry(LOCAL.name, path="/elsewhere")
    with pytest.raises(ModelEntryError, match=r"already registered \(/models/qwen2.5-3b-w4\); pass --replace"):
        settings.add_model(moved)
    assert settings.add_model(moved, replace=True) == LOCAL and settings.models == [moved]
    for bad, fragment in (("", "empty"), ("../../evil", "plain folder name"), ("a\nb", "control characters")):
        with pytest.raises(ModelEntryError, match=fragment):
            settings.add_model(ModelEntry(bad or " ", path="/x"))


@pytest.mark.parametrize("name, fragment", [
    *((f"qwen{c}3b", f"contains {c!r}, which Windows does not allow in a folder name") for c in '<>"|?*'),
    ("Qwen2.5.", "ends in a dot, which Windows drops from a folder name (it would be the folder of 'Qwen2.5')"),
    ("CON", "names the device CON on Windows"), ("nul", "names the device NUL on Windows"),
    ("Aux.txt", "names the device AUX on Windows"), ("com1.tar.gz", "names the device COM1 on Windows"),
    ("LPT9", "names the device LPT9 on Windows"), ("tab\there", "control characters"),
])
def test_a_name_windows_cannot_give_a_folder_is_refused_on_every_platform(name, fragment):
    """A model's name becomes its folder's (and its lock's, its staging folders'): on NTFS these fail
    after the download, or open a device, or share one folder with another name."""
    with pytest.raises(ModelEntryError, match=re.escape(fragment)):
        check_model_name(name)
    with pytest.raises(ModelEntryError, match=re.escape(fragment)):
        Settings().add_model(ModelEntry(name, path="/x"))
    for fine in ("CONSOLE", "nul-model", "Qwen2.5-3B w4", "通义千问 2.5", "COM10", "a.b"):
        assert check_model_name(fine) == fine


def test_a_catalog_entry_windows_cannot_name_a_folder_after_is_skipped(tmp_path):
    from app.hub.catalog import catalog_files, read_catalog

    catalog = tmp_path / "catalog.toml"
    catalog.write_text('[[model]]\nname = "Qwen|3B"\nrecipe = "w4"\nhf = { repo = "Qwen/x" }\n', encoding="utf-8")
    problems = read_catalog([catalog_files()[0], catalog]).problems  # (the shipped one, then the user's)
    assert len(problems) == 1 and "'name' contains '|', which Windows does not allow" in problems[0]


@pytest.mark.parametrize("content, problem", [
    ("{ this is not json", "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"version": 2, "models": [' * 100_000, "not valid JSON"),  # nesting deeper than the parser goes
    ('{"version": ' + "9" * 5000 + "}", "not valid JSON"),  # past Python's integer-digits limit
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_a_corrupt_file_is_moved_aside_and_the_user_told_where(config, content, problem):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    settings, notices = load()
    assert settings == Settings()
    backups = list(config.glob("settings.corrupt-*.json"))
    assert len(backups) == 1 and backups[0].read_bytes() == (content if isinstance(content, bytes) else content.encode())
    assert not path.exists()
    assert len(notices) == 1 and problem in notices[0] and str(backups[0]) in notices[0]


def test_backups_never_overwrite_each_other_even_within_one_second(config):
    config.mkdir()
    # Names the next resets would take (this second and the next few) already hold someone's backup.
    now = time.time()
    taken = {config / f"settings.corrupt-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + s))}.json": f"old {s}"
             for s in range(5)}
    for path, text in taken.items():
        path.write_text(text)
    for n in range(3):
        write(settings_path(), f"broken {n}")
        load()
    contents = sorted(p.read_text() for p in config.glob("settings.corrupt-*.json"))
    assert contents == sorted([*taken.values(), "broken 0", "broken 1", "broken 2"])


def test_an_unreadable_file_is_left_alone_and_never_written_over(config):
    settings_path().mkdir(parents=True)  # a folder where the file should be: EISDIR, not corruption
    settings, notices = load()
    assert settings == Settings() and settings_path().is_dir()
    assert not list(config.glob("*corrupt*"))
    assert len(notices) == 1 and str(settings_path()) in notices[0] and "left as it is" in notices[0]
    store = SettingsStore()
    store.load()
    with pytest.raises(SettingsFileError, match="could not be read .* saving would lose what it holds"):
        store.save(Settings(models=[LOCAL]))


@pytest.mark.skipif(os.name != "posix", reason="POSIX file permissions")
def test_a_file_without_read_permission_is_reported_as_such_not_as_corrupt(config):
    good = {"version": 2, "default_model": LOCAL.name, "models": [LOCAL.to_dict()]}
    write(settings_path(), good)
    settings_path().chmod(0)
    script = ("from app.settings.store import SettingsStore\n"
              "store = SettingsStore(); settings = store.load()\n"
              "print(len(settings.models)); print(*store.take_notices(), sep='\\n')\n"
              "try:\n    store.save(settings)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    proc = run([sys.executable, "-c", script], env={**os.environ, "QWEN_TRAY_HOME": str(config.parent)})
    settings_path().chmod(0o600)
    assert proc.returncode == 0, proc.stderr
    count, notice, error = proc.stdout.splitlines()
    assert count == "0" and "Permission denied" in notice and "check its permissions" in notice
    assert error.startswith("SettingsFileError") and "fix its permissions" in error
    assert json.loads(settings_path().read_text()) == good  # the user's registry, untouched
    assert not list(config.glob("*corrupt*"))


def test_one_bad_value_costs_that_value_and_the_file_is_kept_before_it_is_rewritten(config):
    remote = replace(REMOTE, api_key="")  # (a key would be moved into the keyring at once: tests/test_secrets.py)
    write(settings_path(), {"version": 2, "default_model": LOCAL.name,
                            "models": [LOCAL.to_dict(), {"name": "broken", "kind": "remote"}, remote.to_dict()],
                            "preferences": {"language": "en", "max_tokens": 99999,
                                            "hotkeys": {"summarize": "Ctrl+Alt+Q", "todos": "S"}}})
    original = settings_path().read_text()
    settings, notices = load()
    assert settings.models == [LOCAL, remote] and settings.default_model == LOCAL.name
    assert settings.preferences == Preferences(language="en", hotkeys={"summarize": "Ctrl+Alt+Q"})
    assert len(notices) == 3
    assert "models item #2" in notices[0] and "base_url" in notices[0]
    assert "'max_tokens': must be 16..8192, not 99999; using the default 512" in "\n".join(notices)
    assert "'todos': hotkey 'S'" in "\n".join(notices)
    store = SettingsStore()
    with store.edit() as settings:
        settings.preferences = Preferences(language="zh_CN")
    kept = list(config.glob("settings.invalid-*.json"))
    assert [p.read_text() for p in kept] == [original]
    assert [str(n) for n in store.take_notices()][-1].endswith(f"the file as it was is kept as {kept[0]}")
    assert load()[1] == []


def test_where_models_are_downloaded_from_is_checked_like_every_preference(config):
    write(settings_path(), {"version": 2, "preferences": {"model_source": "modelscope",
                                                          "hf_mirror": " https://hf-mirror.com "}})
    settings, notices = load()
    assert notices == [] and settings.preferences.model_source == "modelscope"
    assert settings.preferences.hf_mirror == "https://hf-mirror.com"
    write(settings_path(), {"version": 2, "preferences": {"model_source": "github", "hf_mirror": "hf-mirror.com"}})
    settings, notices = load()
    assert (settings.preferences.model_source, settings.preferences.hf_mirror) == ("hf", "")
    assert "'model_source': must be one of hf, modelscope, not 'github'; using the default 'hf'" in notices[0]
    assert "'hf_mirror': must be empty or a URL starting with http:// or https://" in notices[1]
    with pytest.raises(PreferencesError, match="'hf_mirror': must be empty or a URL"):
        Preferences(hf_mirror="ftp://mirror.example.com")


def test_a_hand_written_file_without_a_version_is_read_as_the_current_one(config):
    write(settings_path(), {"models": [LOCAL.to_dict()], "preferences": {"language": "en"}})
    settings, notices = load()
    assert notices == [] and settings.models == [LOCAL] and settings.preferences.language == "en"


def test_keys_of_a_newer_version_are_written_back(config):
    write(settings_path(), {"version": 3, "sync": {"account": "me"}, "preferences": {"future_option": 1}})
    with SettingsStore().edit() as settings:
        assert settings.extra == {"sync": {"account": "me"}}
        settings.add_model(LOCAL)
    data = json.loads(settings_path().read_text())
    assert data["sync"] == {"account": "me"} and data["preferences"]["future_option"] == 1


def test_version_1_files_move_into_one_and_are_kept_as_backups(config):
    write(config / "settings.json", {"version": 1, "default_model": "local-a",
                                     "models": {"local-a": "/m/a", "Tiny": "/m/tiny-converted"}})
    write(config / "ui-preferences.json", {
        "language": "zh_CN", "active_model": "DashScope", "hotkeys": {"summarize": "ctrl+alt+q"},
        "models": [REMOTE.to_dict(), GGUF.to_dict()]})  # Tiny: converted since, the registry's folder wins
    write(config / "actions.json", [FORMAL.to_dict()])
    originals = {name: (config / name).read_text() for name in ("settings.json", "ui-preferences.json",
                                                                 "actions.json")}
    settings, notices = load()
    assert [(m.name, m.kind) for m in settings.models] == [("local-a", "local"), ("Tiny", "local"),
                                                          ("DashScope", "remote")]
    assert settings.default_model == "local-a" and settings.preferences.active_model == "DashScope"
    assert settings.preferences.hotkeys == {"summarize": "Ctrl+Alt+Q"} and settings.actions == [FORMAL]
    assert len(notices) == 1 and "earlier version were moved into" in notices[0]
    for name, text in originals.items():
        backup = next(config.glob(f"{Path(name).stem}.v1-backup-*.json"))
        assert backup.read_text() == text and str(backup) in notices[0]
    assert sorted(p.name for p in config.iterdir() if ".v1-backup-" not in p.name) == ["settings.json"]
    again, notices = load()
    assert again == settings and notices == []
    assert len(list(config.glob("*.v1-backup-*"))) == 3  # migrated once


def test_an_unreadable_version_1_file_stops_the_migration_until_it_can_be_read(config):
    write(config / "ui-preferences.json", {"language": "en"})
    (config / "actions.json").mkdir()
    settings, notices = load()
    assert settings.preferences.language == "en"
    assert any(str(config / "actions.json") in n and "left as it is" in n for n in notices)
    assert not settings_path().exists() and (config / "ui-preferences.json").exists()
    store = SettingsStore()
    store.load()
    with pytest.raises(SettingsFileError, match="actions.json could not be read"):
        store.save(settings)


def test_keep_aside_copies_or_moves_under_a_new_name(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text("1")
    copied = keep_aside(path, "invalid", copy=True)
    moved = keep_aside(path)
    assert path.exists() is False and copied.read_text() == moved.read_text() == "1"
    assert copied.name.startswith("chat.invalid-") and moved.name.startswith("chat.corrupt-")
