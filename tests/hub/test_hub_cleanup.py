"""The download is deleted once its checkpoint is registered; on Windows a file still open or
mapped cannot be, and what stays (gigabytes) is said, with its folder and size, not swallowed.
Windows' refusal is imitated by an os.unlink that fails for the weights file."""

from __future__ import annotations

import os

import pytest
from hub_support import TINY_NAME

import app.hub.job
from app.hub.job import remove_download
from app.model_folders import folder_bytes
from app.progress import format_bytes

WEIGHTS = "model.safetensors"
REAL_UNLINK = os.unlink


@pytest.fixture
def held_weights(monkeypatch):
    """os.unlink refuses ``WEIGHTS`` as Windows refuses an open or mapped file, for the first
    ``times`` tries (None: until the test ends)."""
    monkeypatch.setattr(app.hub.job, "REMOVE_RETRY_WAIT_S", 0.0)

    def hold(times: int | None = None) -> list[str]:
        refused = []

        def unlink(path, *args, **kwargs):
            if os.path.basename(path) == WEIGHTS and (times is None or len(refused) < times):
                refused.append(path)
                raise PermissionError(13, "The process cannot access the file because it is being used", path)
            return REAL_UNLINK(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)
        return refused

    return hold


def _download(folder):
    (folder / "sub").mkdir(parents=True)
    (folder / WEIGHTS).write_bytes(b"w" * 4096)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "tokenizer.json").write_text("{}")
    return folder


def test_a_download_is_deleted_whole(tmp_path):
    folder = _download(tmp_path / "m.hf")
    assert remove_download(folder) is None and not folder.exists()
    assert remove_download(folder) is None  # nothing there: nothing to say


def test_a_file_let_go_after_a_moment_is_deleted_on_the_second_try(tmp_path, held_weights):
    folder = _download(tmp_path / "m.hf")
    refused = held_weights(times=1)
    assert remove_download(folder) is None and not folder.exists()
    assert len(refused) == 1


def test_a_file_still_in_use_leaves_the_folder_which_is_returned_with_only_that_file(tmp_path, held_weights):
    folder = _download(tmp_path / "m.hf")
    held_weights()
    assert remove_download(folder) == folder
    assert sorted(p.name for p in folder.rglob("*")) == [WEIGHTS]  # the rest went
    assert folder_bytes(folder) == 4096


def test_models_get_says_what_it_could_not_delete(run_cli, hub, home, tiny_catalog, held_weights):
    held_weights()
    got = run_cli("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", hub.url)
    assert got.returncode == 0, got.stderr
    source = home / "data" / "downloads" / f"{TINY_NAME}.hf"
    size = format_bytes((source / WEIGHTS).stat().st_size)
    assert got.stdout.splitlines()[-1] == (
        f"note: the download {source} ({size}) could not be deleted completely (a file in it was in use); it can be "
        "deleted once Qwen Tray is closed")
