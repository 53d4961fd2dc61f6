"""`qwen-tray models remove NAME` and `models add --replace`: a folder the app made goes (with how
much disk it frees), a folder the user registered from elsewhere never does; the default model
stays valid and the line says what it is now."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.progress import format_bytes
from app.settings.models import ModelEntry
from app.settings.store import SettingsStore
from tests.conftest import assert_one_line_error
from tests.test_gguf_import import write_tiny_gguf


@pytest.fixture
def imported(cli, tmp_path):
    """imported(name): a model the app made (import-gguf of a tiny GGUF) -> its folder."""
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, arch="qwen2")

    def add(name: str) -> Path:
        done = cli("models", "import-gguf", str(gguf), "--name", name)
        assert done.returncode == 0, done.stderr
        return tmp_path / "data" / "models" / name

    return add


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _registered() -> dict[str, str]:
    return {m.name: m.path for m in SettingsStore().load().models}


def test_remove_deletes_the_folder_the_app_made_and_says_what_is_the_default_now(cli, imported):
    first, second = imported("first"), imported("second")
    size, second_size = _bytes(first), _bytes(second)
    removed = cli("models", "remove", "first")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines() == [f"removed first: deleted {first}, {format_bytes(size)} freed; "
                                           "the default model is now second"]
    assert not first.exists() and "first" not in _registered()
    assert sorted(p.name for p in first.parent.iterdir()) == ["second"]  # nothing hidden left behind
    last = cli("models", "remove", "second")
    assert last.stdout.splitlines() == [f"removed second: deleted {second}, {format_bytes(second_size)} freed; "
                                        "there is no default model now (`qwen-tray models default NAME` chooses one)"]
    assert cli("models", "list").stdout.startswith("no models registered")


def test_a_folder_registered_from_elsewhere_is_only_unregistered(cli, imported, tiny_qwen_dir):
    imported("made")
    assert cli("models", "add", "mine", str(tiny_qwen_dir)).returncode == 0
    removed = cli("models", "remove", "mine")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines() == [f"removed mine: its folder {tiny_qwen_dir} was added with `models add` "
                                           "and is yours, so it stays; nothing was deleted"]
    assert (tiny_qwen_dir / "config.json").is_file() and "mine" not in _registered()


def test_keep_files_only_unregisters(cli, imported):
    folder = imported("kept")
    removed = cli("models", "remove", "kept", "--keep-files")
    assert removed.stdout.splitlines() == [f"removed kept: its folder {folder} stays (--keep-files); nothing was "
                                           "deleted; there is no default model now (`qwen-tray models default NAME` "
                                           "chooses one)"]
    assert (folder / "config.json").is_file() and "kept" not in _registered()


def test_keep_files_on_a_folder_that_stays_anyway_says_why_it_stays(cli, tiny_qwen_dir):
    assert cli("models", "add", "mine", str(tiny_qwen_dir)).returncode == 0
    removed = cli("models", "remove", "mine", "--keep-files")
    assert removed.stdout.splitlines() == [f"removed mine: its folder {tiny_qwen_dir} was added with `models add` "
                                           "and is yours, so it stays; nothing was deleted; there is no default "
                                           "model now (`qwen-tray models default NAME` chooses one)"]


def test_a_folder_another_name_uses_stays(cli, imported):
    folder = imported("one")
    assert cli("models", "add", "alias", str(folder)).returncode == 0
    removed = cli("models", "remove", "one")
    assert removed.stdout.splitlines() == [f"removed one: its folder {folder} stays, model 'alias' uses it too; "
                                           "nothing was deleted; the default model is now alias"]
    assert (folder / "config.json").is_file()


def test_a_remote_endpoint_has_nothing_on_disk(cli):
    with SettingsStore().edit() as settings:
        settings.add_model(ModelEntry(name="api", kind="remote", base_url="https://api.example.com/v1", model="m"))
    removed = cli("models", "remove", "api")
    assert removed.stdout.splitlines() == ["removed api: a remote endpoint (https://api.example.com/v1), nothing on "
                                           "disk; nothing was deleted; there is no default model now "
                                           "(`qwen-tray models default NAME` chooses one)"]


def test_an_unknown_name_is_refused_in_one_sentence(cli, imported):
    imported("here")
    assert_one_line_error(cli("models", "remove", "nope"), "no model named 'nope'", "models list")
    assert "here" in _registered()


def test_add_replace_deletes_the_old_folder_only_when_the_app_made_it(cli, imported, tiny_qwen_dir, tmp_path):
    old = imported("swap")
    size = _bytes(old)
    replaced = cli("models", "add", "swap", str(tiny_qwen_dir), "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert replaced.stdout.splitlines() == [f"swap (default): {tiny_qwen_dir} (was {old}; its folder {old} was deleted, "
                                            f"{format_bytes(size)} freed)"]
    assert not old.exists() and _registered()["swap"] == str(tiny_qwen_dir)
    again = cli("models", "add", "swap", str(imported("other")), "--replace")
    assert again.returncode == 0, again.stderr
    assert (tiny_qwen_dir / "config.json").is_file()  # the user's folder: only unregistered
    assert again.stdout.splitlines() == [f"swap (default): {tmp_path / 'data' / 'models' / 'other'} (was {tiny_qwen_dir})"]
