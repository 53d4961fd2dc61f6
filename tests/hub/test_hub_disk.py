"""Disk space, on a real small filesystem (a tmpfs): refused before the first byte when the
download and the checkpoint cannot fit; one clear line when the disk fills up meanwhile."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from hub_support import TINY_MODEL, TINY_NAME, registered_models
from fake_hub import Faults

from app.hub.catalog import find_entry
from app.hub.errors import DiskSpaceError
from app.hub.job import GetModelJob
from tests.conftest import assert_one_line_error

WEIGHTS = "model.safetensors"


@contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root (CI runs as root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_refused_before_downloading_when_it_cannot_fit(run_cli, tmp_path, monkeypatch, hub, tiny_hub_model):
    from hub_support import catalog_toml

    with tmpfs(tmp_path / "small", "64m") as small:
        home = small / "home"
        monkeypatch.setenv("QWEN_TRAY_HOME", str(home))
        (home / "config").mkdir(parents=True)
        (home / "config" / "catalog.toml").write_text(catalog_toml(tiny_hub_model))
        got = run_cli("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", hub.url)
        assert_one_line_error(got, f"not enough disk space for {TINY_MODEL}", "MB is free", str(small))
        assert not hub.requests_for("/resolve/") and not hub.requests_for("/cdn/")  # not one byte fetched
        assert TINY_MODEL not in registered_models()


def test_a_disk_that_fills_up_meanwhile(tmp_path, monkeypatch, hub, tiny_hub_model):
    from hub_support import catalog_toml

    hub.faults[WEIGHTS] = Faults(stall_after=25 << 20)
    with tmpfs(tmp_path / "disk", "330m") as disk:
        home = disk / "home"
        monkeypatch.setenv("QWEN_TRAY_HOME", str(home))
        (home / "config").mkdir(parents=True)
        (home / "config" / "catalog.toml").write_text(catalog_toml(tiny_hub_model))
        job = GetModelJob(find_entry(TINY_NAME), method="rtn", endpoint=hub.url)
        errors = []
        worker = threading.Thread(target=lambda: _run(job, errors))
        worker.start()
        assert hub.stalled.wait(60)
        _fill(disk / "filler")  # another program takes the rest of the disk
        hub.release.set()
        worker.join(60)
        assert len(errors) == 1 and isinstance(errors[0], DiskSpaceError), errors
        assert "the disk filled up while downloading model.safetensors" in str(errors[0])
        assert "resumes" in str(errors[0])
        assert (job.source_folder / (WEIGHTS + ".part")).stat().st_size > 0  # kept for the next run
        assert TINY_MODEL not in registered_models()


def _fill(path, leave: int = 64 << 10) -> None:
    """Take all but ``leave`` bytes of the disk; the stalled download may still be flushing what
    it had received, so the free space is read again when a try comes too close to it."""
    for _ in range(8):
        try:
            with path.open("wb") as f:
                os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(path.parent).free - leave)
            return
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            leave *= 2
    raise AssertionError(f"could not fill {path.parent}")


def _run(job, errors) -> None:
    try:
        job.run(lambda progress: None)
    except Exception as e:  # noqa: BLE001 - the test inspects it
        errors.append(e)
