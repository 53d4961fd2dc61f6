"""app.paths.atomic_write_text on Windows: a target another program holds open (antivirus, the
indexer, a second tray reading settings.json) makes os.replace fail with PermissionError for a
moment; the rename is tried again for about a second, and a lasting failure says the file is in
use instead of advising to make its folder writable. Windows is imitated with an injected
os.replace that fails as MoveFileEx does."""

from __future__ import annotations

import errno
import os

import pytest

import app.paths
from app.paths import REPLACE_ATTEMPTS, REPLACE_WAIT_S, FileInUseError, atomic_write_text, replace_file
from app.settings.jsonfile import SettingsFileError, write_json

REAL_REPLACE = os.replace  # the fixture below puts HeldOpen in os.replace's place


class HeldOpen:
    """os.replace as Windows runs it while another process holds the target: PermissionError
    (WinError 5) for the first ``busy`` calls, then the real rename."""

    def __init__(self, busy: int):
        self.busy, self.calls = busy, 0

    def __call__(self, src, dst):
        self.calls += 1
        if self.calls <= self.busy:
            raise PermissionError(errno.EACCES, "Access is denied", str(dst))
        REAL_REPLACE(src, dst)


def test_a_short_hold_is_waited_out(tmp_path):
    (tmp_path / "new").write_text("new")
    replace, slept = HeldOpen(busy=2), []
    replace_file(tmp_path / "new", tmp_path / "settings.json", retry=True, replace=replace, sleep=slept.append)
    assert (tmp_path / "settings.json").read_text() == "new"
    assert replace.calls == 3 and slept == [REPLACE_WAIT_S] * 2


def test_a_lasting_hold_gives_up_after_about_a_second_and_says_the_file_is_in_use(tmp_path):
    (tmp_path / "new").write_text("new")
    replace, slept = HeldOpen(busy=99), []
    with pytest.raises(FileInUseError) as caught:
        replace_file(tmp_path / "new", tmp_path / "settings.json", retry=True, replace=replace, sleep=slept.append)
    assert replace.calls == REPLACE_ATTEMPTS and 0.75 <= sum(slept) <= 1.5
    assert caught.value.strerror == "it is in use by another program (or read-only)"
    assert isinstance(caught.value, PermissionError)  # callers catching OSError still catch it


def test_without_retry_and_for_other_errors_there_is_no_wait(tmp_path):
    slept = []
    with pytest.raises(PermissionError) as caught:
        replace_file(tmp_path / "a", tmp_path / "b", retry=False, replace=HeldOpen(busy=1), sleep=slept.append)
    assert not isinstance(caught.value, FileInUseError)
    with pytest.raises(FileNotFoundError):  # not a hold: said at once
        replace_file(tmp_path / "missing", tmp_path / "b", retry=True, sleep=slept.append)
    assert slept == []


@pytest.fixture
def windows_replace(monkeypatch):
    """atomic_write_text as on Windows, with a target held open for ``busy`` renames."""
    monkeypatch.setattr(app.paths, "REPLACE_RETRIES_ON_WINDOWS", True)
    monkeypatch.setattr(app.paths, "REPLACE_WAIT_S", 0.0)

    def hold(busy: int) -> HeldOpen:
        replace = HeldOpen(busy)
        monkeypatch.setattr(app.paths.os, "replace", replace)
        return replace

    return hold


def test_atomic_write_goes_through_once_the_other_program_lets_go(tmp_path, windows_replace):
    target = tmp_path / "settings.json"
    target.write_text("old")
    windows_replace(busy=REPLACE_ATTEMPTS - 1)
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["settings.json"]


def test_a_settings_save_that_stays_blocked_names_the_cause_and_keeps_the_old_file(tmp_path, windows_replace):
    target = tmp_path / "settings.json"
    target.write_text("old")
    windows_replace(busy=99)
    with pytest.raises(SettingsFileError) as caught:
        write_json(target, {"version": 2})
    message = str(caught.value)
    assert message.startswith(f"cannot save {target}: it is in use by another program (or read-only); close ")
    assert "writable" not in message
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["settings.json"]  # no temporary file left
