"""The settings as the CLI meets them: one-line errors for what the user typed or what the folder
allows, every command still working on a broken, unreadable or read-only settings file, and
the user told where a broken file went. Permission cases run without root's override
(tests/unprivileged.py), so they hold in CI, which runs as root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings.models import ModelEntry
from app.settings.store import SettingsStore
from tests.conftest import assert_one_line_error
from tests.unprivileged import run_cli_commands

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX file permissions")
ASK = ["--device", "cpu", "--temperature", "0", "--max-tokens", "3", "hi"]


def registry(home: Path, *entries: ModelEntry) -> Path:
    """A settings file under ``home`` with ``entries`` registered (the first is the default)."""
    with SettingsStore(home / "config" / "settings.json").edit() as settings:
        for entry in entries:
            settings.add_model(entry)
    return home / "config" / "settings.json"


# -- models add / default: what the user typed --------------------------------------------------
@pytest.mark.parametrize("name, fragment", [("", "the model name is empty"),
                                            ("../../evil", "must be a plain folder name"),
                                            ("a/b", "must be a plain folder name"),
                                            ("qwen 3b?", "contains '?', which Windows does not allow in a "
                                                         "folder name"),
                                            ("NUL.txt", "names the device NUL on Windows"),
                                            ("n" * 101, "is too long (101 characters); use at most 100 characters"),
                                            ("模" * 67, "is too long (67 characters); use at most 100 characters "
                                                       "(200 bytes in UTF-8, about 66 Chinese characters)")])
def test_models_add_refuses_a_name_that_cannot_be_one(cli, tiny_qwen_dir, name, fragment):
    assert_one_line_error(cli("models", "add", name, str(tiny_qwen_dir)), fragment)
    assert cli("models", "list").stdout.startswith("no models registered")


def test_models_add_refuses_a_folder_that_is_not_a_model(cli, tmp_path, tiny_qwen_dir):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen_dir, broken)
    (broken / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], ', encoding="utf-8")
    assert_one_line_error(cli("models", "add", "broken", str(broken)), str(broken / "config.json"), "not valid JSON")
    (broken / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}', encoding="utf-8")
    assert_one_line_error(cli("models", "add", "broken", str(broken)), "GPT2LMHeadModel", "not supported")
    assert_one_line_error(cli("models", "add", "gone", str(tmp_path / "gone")), "gone", "no such folder")
    (tmp_path / "notes.txt").write_text("x")
    assert_one_line_error(cli("models", "add", "file", str(tmp_path / "notes.txt")), "notes.txt", "not a folder")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert_one_line_error(cli("models", "add", "g", str(tmp_path / "m.gguf")), "a GGUF file", "models import-gguf")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(cli("models", "add", "empty", str(empty)), "not a model folder")
    assert cli("models", "list").stdout.startswith("no models registered")


def test_models_add_never_re_points_a_name_silently(cli, tmp_path, tiny_qwen_dir):
    other = tmp_path / "other"
    shutil.copytree(tiny_qwen_dir, other)
    assert cli("models", "add", "tiny", str(tiny_qwen_dir)).returncode == 0
    assert cli("models", "add", "tiny", str(tiny_qwen_dir)).returncode == 0  # the same again: fine
    assert_one_line_error(cli("models", "add", "tiny", str(other)), "'tiny' is already registered",
                          str(tiny_qwen_dir), "--replace")
    assert f"* tiny  {tiny_qwen_dir}" in cli("models", "list").stdout
    replaced = cli("models", "add", "tiny", str(other), "--replace")
    assert replaced.returncode == 0 and replaced.stdout.strip() == f"tiny (default): {other} (was {tiny_qwen_dir})"
    assert f"* tiny  {other}" in cli("models", "list").stdout


def test_import_gguf_refuses_a_taken_name_before_converting(cli, tmp_path, tiny_qwen_dir):
    from tests.test_gguf_import import write_tiny_gguf

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    assert cli("models", "add", "tiny", str(tiny_qwen_dir)).returncode == 0
    assert_one_line_error(cli("models", "import-gguf", str(gguf)), "'tiny' is already registered", "--replace")
    assert not (tmp_path / "data" / "models" / "tiny").exists()  # refused before the slow part


def test_import_gguf_says_what_a_file_that_is_not_gguf_is(cli, tmp_path, tiny_qwen_dir):
    """Checked by its first bytes, before the gguf reader (whose numpy errors said nothing)."""
    notes, empty = tmp_path / "notes.gguf", tmp_path / "empty.gguf"
    notes.write_text("just some text, saved with the wrong name\n")
    empty.write_bytes(b"")
    for path, fragment in [(notes, "(it does not start with the bytes 'GGUF')"), (empty, "(it is empty)"),
                           (tiny_qwen_dir / "model.safetensors", "register the folder with `qwen-tray models add")]:
        proc = cli("models", "import-gguf", str(path))
        assert_one_line_error(proc, f"{path.resolve()} is not a GGUF file", fragment)
        assert "Error" not in proc.stderr  # no ValueError/IndexError from the reader
    assert_one_line_error(cli("models", "import-gguf", str(tiny_qwen_dir)),
                          f"{tiny_qwen_dir.resolve()} is a folder, not a GGUF file", "models add")
    assert cli("models", "list").stdout.startswith("no models registered")
    assert not (tmp_path / "data" / "models").exists() or not any((tmp_path / "data" / "models").iterdir())


def test_import_gguf_says_a_cut_short_file_is_truncated(cli, tmp_path):
    from tests.test_gguf_import import write_tiny_gguf

    whole = tmp_path / "whole.gguf"
    write_tiny_gguf(whole, arch="qwen2")
    data = whole.read_bytes()
    for cut in (3, 6, 100, len(data) // 2, len(data) - 1):  # magic, version, header, tensor data
        cut_short = tmp_path / f"cut{cut}.gguf"
        cut_short.write_bytes(data[:cut])
        proc = cli("models", "import-gguf", str(cut_short))
        assert_one_line_error(proc, f"{cut_short.resolve()} is truncated or damaged")
        assert "Error" not in proc.stderr
    old = tmp_path / "old.gguf"
    old.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + data[8:])
    assert_one_line_error(cli("models", "import-gguf", str(old)), f"{old.resolve()} is a GGUF file of version 1")
    assert cli("models", "list").stdout.startswith("no models registered")


def test_models_default_names_a_registered_model(cli, tiny_qwen_dir):
    assert_one_line_error(cli("models", "default", "nope"), "no model named 'nope'", "models list")
    assert cli("models", "add", "tiny", str(tiny_qwen_dir)).returncode == 0
    chosen = cli("models", "default", "tiny")
    assert chosen.returncode == 0 and chosen.stdout == "default model: tiny\n"


def test_a_default_model_no_longer_registered_is_said_so(tmp_path, cli, tiny_qwen_dir):
    path = registry(tmp_path, ModelEntry("tiny", path=str(tiny_qwen_dir)))  # the cli fixture's home
    data = json.loads(path.read_text(encoding="utf-8"))
    data["default_model"] = "gone"  # edited by hand, or a registry from another machine
    path.write_text(json.dumps(data), encoding="utf-8")
    listed = cli("models", "list")
    assert "the default model 'gone' is not registered" in listed.stdout
    assert_one_line_error(cli("ask", "hi"), "the default model 'gone' is not registered", "models default NAME")


def test_a_default_model_whose_folder_is_gone_names_the_entry_and_the_ways_out(tmp_path, cli, tiny_qwen_dir):
    gone = tmp_path / "x"
    shutil.copytree(tiny_qwen_dir, gone)
    assert cli("models", "add", "mine", str(gone), "--default").returncode == 0
    assert cli("models", "add", "other", str(tiny_qwen_dir)).returncode == 0
    shutil.rmtree(gone)
    assert_one_line_error(cli("ask", "hi"), f"the default model 'mine' is registered at {gone}",
                          "`qwen-tray models default other`", "`qwen-tray models remove mine`")
    assert_one_line_error(cli("serve", "--port", "0"), "'mine'", "models remove mine")
    assert_one_line_error(cli("ask", "--model", "mine", "hi"), "models remove mine")


def test_the_registry_lists_every_kind_and_ask_says_what_a_remote_one_is(cli, tmp_path, tiny_qwen_dir):
    registry(tmp_path, ModelEntry("DashScope", kind="remote", base_url="https://dash.example.com/v1", model="qwen"),
             ModelEntry("tiny", path=str(tiny_qwen_dir)), ModelEntry("Big", kind="gguf", path="/dl/big.gguf"))
    listed = cli("models", "list").stdout.splitlines()
    assert listed == ["  Big  GGUF file /dl/big.gguf (converted when first loaded)",
                      "* DashScope  remote https://dash.example.com/v1 (model qwen)", f"  tiny  {tiny_qwen_dir}"]
    assert_one_line_error(cli("ask", "hi"), "'DashScope' is a remote endpoint", "--model")
    assert_one_line_error(cli("ask", "--model", "Big", "hi"), "not converted yet", "import-gguf /dl/big.gguf")
    assert cli("ask", "--model", "tiny", *ASK).returncode == 0


def test_quantize_into_an_existing_file_is_a_one_line_error(cli, tmp_path, tiny_qwen_dir):
    out = tmp_path / "not-a-folder.bin"
    out.write_bytes(b"keep me")
    assert_one_line_error(cli("quantize", "--model", str(tiny_qwen_dir), "--recipe", "w4", "--method", "rtn",
                              "--out", str(out)), str(out), "must be a folder")
    assert_one_line_error(cli("quantize", "--model", str(tiny_qwen_dir), "--recipe", "w4", "--method", "rtn",
                              "--out", str(out / "inside")), f"{out} is a file")
    assert out.read_bytes() == b"keep me"


# -- a broken settings file: every command goes on and says where it went -------------------------
@posix_only
def test_a_symlinked_settings_file_is_written_through_and_stays_a_link(cli, tmp_path, tiny_qwen_dir):
    """A settings file kept in a dotfiles folder (stow, chezmoi, home-manager) and linked into place."""
    dotfiles = registry(tmp_path / "dotfiles", ModelEntry("first", path=str(tiny_qwen_dir)))
    link = tmp_path / "config" / "settings.json"
    link.parent.mkdir()
    link.symlink_to(dotfiles)
    assert cli("models", "add", "second", str(tiny_qwen_dir)).returncode == 0
    assert link.is_symlink() and link.resolve() == dotfiles
    assert [m["name"] for m in json.loads(dotfiles.read_text(encoding="utf-8"))["models"]] == ["first", "second"]
    assert sorted(p.name for p in dotfiles.parent.iterdir()) == ["settings.json"]  # no temp file left beside it
    assert [p.name for p in link.parent.iterdir()] == ["settings.json"]


def test_doctor_tells_where_a_corrupt_settings_file_went(cli, tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.json").write_text("{ broken", encoding="utf-8")
    done = cli("doctor")
    assert done.returncode == 0
    backup = next(config.glob("settings.corrupt-*.json"))
    assert done.stderr.splitlines() == [f"qwen-tray: {config / 'settings.json'} could not be used (not valid JSON "
                                        f"(Expecting property name enclosed in double quotes: line 1 column 3 "
                                        f"(char 2))); it was moved to {backup} and the defaults are used"]
    assert f"Settings: {config / 'settings.json'}" in done.stdout.splitlines()


# -- permissions: as a user without root's override ---------------------------------------------
@posix_only
def test_a_read_only_config_folder_gives_one_sentence_on_write_and_reads_fine(tmp_path, tiny_qwen_dir):
    settings = registry(tmp_path, ModelEntry("tiny", path=str(tiny_qwen_dir)), ModelEntry("other", path="/m/o"))
    before = settings.read_bytes()
    settings.parent.chmod(0o555)
    try:
        add, default, same_default, listed, doctor, ask = run_cli_commands(
            tmp_path, ["models", "add", "again", str(tiny_qwen_dir)], ["models", "default", "other"],
            ["models", "default", "tiny"], ["models", "list"], ["doctor"], ["ask", *ASK])
    finally:
        settings.parent.chmod(0o755)
    for proc in (add, default):
        assert_one_line_error(proc, f"cannot save {settings}: Permission denied",
                              f"make {settings.parent} writable, or set QWEN_TRAY_HOME")
    assert same_default.returncode == 0 and same_default.stderr == ""  # nothing to change, nothing written
    assert listed.returncode == 0 and listed.stderr == ""
    assert listed.stdout == f"  other  /m/o  (missing)\n* tiny  {tiny_qwen_dir}\n"
    assert doctor.returncode == 1 and "* tiny: float16 folder" in doctor.stdout and doctor.stderr == ""
    assert "  other: missing (/m/o)" in doctor.stdout  # registered, and gone: exit status 1
    assert ask.returncode == 0 and ask.stdout.strip(), ask.stderr
    assert settings.read_bytes() == before


@posix_only
def test_a_corrupt_file_in_a_read_only_folder_is_left_and_no_command_crashes(tmp_path, tiny_qwen_dir):
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.json").write_text("{ broken", encoding="utf-8")
    config.chmod(0o555)
    try:
        listed, doctor, ask_default, ask, add = run_cli_commands(
            tmp_path, ["models", "list"], ["doctor"], ["ask", "hi"], ["ask", "--model", str(tiny_qwen_dir), *ASK],
            ["models", "add", "tiny", str(tiny_qwen_dir)])
    finally:
        config.chmod(0o755)
    notice = (f"qwen-tray: {config / 'settings.json'} could not be used (not valid JSON (Expecting property name "
              "enclosed in double quotes: line 1 column 3 (char 2))) and could not be moved aside (Permission "
              "denied); the defaults are used for now and the file is left as it is")
    for proc in (listed, doctor, ask_default, ask, add):
        assert "Traceback" not in proc.stderr and proc.stderr.splitlines()[0] == notice
    fix = f"no model can be registered until it is fixed: make {config} writable or move the file away"
    assert listed.stdout == ""  # not "no models registered": the registry could not be read
    assert_one_line_error(subprocess.CompletedProcess([], listed.returncode, "", listed.stderr.split("\n", 1)[1]),
                          f"the registered models cannot be listed: {config / 'settings.json'} could not be used",
                          f"make {config} writable or move the file away, then try again")
    assert doctor.returncode == 1 and "Models: none registered" not in doctor.stdout  # they could not be read
    assert f"Models: cannot be listed: {config / 'settings.json'} could not be used" in doctor.stdout
    assert ask_default.returncode == 1 and fix in ask_default.stderr.splitlines()[1]
    assert ask_default.stderr.splitlines()[1].endswith("; or pass --model PATH")
    assert ask.returncode == 0 and ask.stdout.strip()
    assert add.returncode == 1 and add.stderr.splitlines()[1].startswith(
        f"qwen-tray: error: cannot save {config / 'settings.json'}: {config / 'settings.json'} could not be used")
    assert (config / "settings.json").read_text() == "{ broken" and not list(config.glob("*corrupt*"))


@posix_only
def test_an_unreadable_settings_file_is_reported_as_such_and_kept(tmp_path, tiny_qwen_dir):
    settings = registry(tmp_path, ModelEntry("tiny", path=str(tiny_qwen_dir)))
    before = settings.read_bytes()
    settings.chmod(0)
    try:
        listed, doctor, add, ask, default, remove, ask_tiny = run_cli_commands(
            tmp_path, ["models", "list"], ["doctor"], ["models", "add", "again", str(tiny_qwen_dir)], ["ask", "hi"],
            ["models", "default", "tiny"], ["models", "remove", "tiny"], ["ask", "--model", "tiny", "hi"])
    finally:
        settings.chmod(0o600)
    notice = (f"qwen-tray: {settings} cannot be read (Permission denied); the defaults are used for now and the "
              "file is left as it is: check its permissions")
    fix = "fix its permissions or move it away (e.g. to settings.json.bak)"
    unread = f"{settings} could not be read (Permission denied); {fix}, then try again"
    assert listed.returncode == 1 and listed.stdout == ""  # not "no models registered": nothing could be read
    assert listed.stderr.splitlines() == [notice, f"qwen-tray: error: the registered models cannot be listed: {unread}"]
    for proc in (default, remove, ask_tiny):  # not "no model named 'tiny'": it is registered, the file is unread
        assert proc.returncode == 1 and proc.stderr.splitlines() == [
            notice, f"qwen-tray: error: model 'tiny' cannot be looked up: {unread}"], proc.stderr
    assert doctor.returncode == 1 and doctor.stderr.splitlines() == [notice]  # not "none registered" and 0
    assert f"Models: cannot be listed: {unread} (exit status 1)" in doctor.stdout.splitlines()
    assert add.returncode == 1 and add.stderr.splitlines() == [
        notice, f"qwen-tray: error: cannot save {settings}: {settings} could not be read (Permission denied), and "
                f"saving would lose what it holds; {fix}, then try again"]
    assert ask.returncode == 1 and fix in ask.stderr.splitlines()[-1] and "add-starter" not in ask.stderr
    assert settings.read_bytes() == before and json.loads(before)["models"][0]["name"] == "tiny"
    assert not list(settings.parent.glob("*corrupt*"))


def test_commands_run_at_the_same_time_each_keep_their_registration(tmp_path, tiny_qwen_dir):
    """`for i in ...; do qwen-tray models add ... & done`: no edit undoes another's."""
    env = {**os.environ, "QWEN_TRAY_HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, "-m", "app.cli", "models", "add", f"m{i}", str(tiny_qwen_dir)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(8)]
    for proc in procs:
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
    settings = SettingsStore(tmp_path / "home" / "config" / "settings.json").load()
    assert sorted(m.name for m in settings.models) == [f"m{i}" for i in range(8)]
