"""A full disk, for real: the kernel's own ENOSPC, not a patched write.

Conversions run in a child process that mounts a small tmpfs in a mount namespace of its own
(`unshare -rm`: a user namespace, so no root is needed where they are allowed): the converter
meets a file system that is actually full. The tray's log file writes to /dev/full, whose every
write fails with ENOSPC.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TMPFS_MB = 24  # less than the starter's float16 folder (~270 MB), more than its tokenizer files


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


needs_tmpfs = pytest.mark.skipif(not _namespaces_work(), reason="mounting a small tmpfs needs `unshare -rm` (Linux "
                                 "user namespaces)")


def _on_small_disk(mount: Path, *argv: str, home: Path) -> subprocess.CompletedProcess:
    """``argv`` run with a TMPFS_MB tmpfs mounted at ``mount`` (seen by that process only)."""
    mount.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={TMPFS_MB}m tmpfs "$1" && shift && exec "$@"'
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", str(mount), *argv], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=600)


@needs_tmpfs
def test_add_starter_checks_the_free_space_before_converting(tmp_path):
    home = tmp_path / "home"
    walk = "import os, sys; print([n for r, ds, fs in os.walk(sys.argv[1]) for n in ds + fs if 'partial' in n])"
    proc = _on_small_disk(home, "sh", "-c", f'{sys.executable} -m app.cli models add-starter; echo "exit $?"; '
                                            f'{sys.executable} -c "{walk}" "$0"', str(home), home=home)
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"qwen-tray: error: not enough disk space for converting {_starter_gguf_name()}: ")
    assert f"on {home} (" in lines[0] and lines[0].endswith("free some space and try again")
    assert proc.stdout.splitlines() == ["exit 1", "[]"]  # refused before converting: no staging folder


@needs_tmpfs
def test_a_disk_that_fills_up_while_converting_is_one_sentence_and_leaves_nothing(tmp_path):
    """Past the check (another program filled the disk meanwhile): the write fails with ENOSPC."""
    code = (
        "import json, os, sys\n"
        "from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf\n"
        "from app.errors import QwenTrayError\n"
        "out = os.path.join(sys.argv[1], 'models', 'starter')\n"
        "try:\n"
        "    convert_gguf_to_hf(find_starter_gguf(), out)\n"
        "    error = None\n"
        "except QwenTrayError as e:\n"
        "    error = str(e)\n"
        "left = [os.path.join(r, n) for r, ds, fs in os.walk(sys.argv[1]) for n in ds + fs]\n"
        "print(json.dumps({'error': error, 'left': left}))\n")
    disk = tmp_path / "disk"
    proc = _on_small_disk(disk, sys.executable, "-c", code, str(disk), home=tmp_path / "home")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result["error"] == (f"cannot convert {_starter_gguf_name()} into {disk / 'models' / 'starter'}: the disk "
                               "is full (No space left on device); the partial conversion was removed: free some "
                               "space and try again")
    assert result["left"] == [str(disk / "models")]  # the staging folder is gone


def _starter_gguf_name() -> str:
    from app.engine.gguf_import import find_starter_gguf

    return find_starter_gguf().name


def test_the_tray_log_file_on_a_full_disk_warns_once_and_stops(tmp_path):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "qwen-tray.log").symlink_to("/dev/full")  # every write: ENOSPC
    code = ("import logging\n"
            "from app.ui.app import _log_to_file\n"
            "handler = _log_to_file()\n"
            "for i in range(5):\n"
            "    logging.getLogger('app.test').warning('line %d', i)\n"
            "print('failed' if handler.failed else 'ok')\n")
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == "failed\n", proc.stderr
    assert proc.stderr == (f"qwen-tray: warning: cannot write the log file {home / 'data' / 'qwen-tray.log'} (No "
                           "space left on device); logging to it stops until the app restarts\n")


def test_the_tray_log_file_keeps_logging_where_the_disk_takes_it(tmp_path):
    home = tmp_path / "home"
    code = ("import logging\n"
            "from app.ui.app import _log_to_file\n"
            "handler = _log_to_file()\n"
            "logging.getLogger('app.test').warning('written')\n")
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "WARNING app.test: written" in (home / "data" / "qwen-tray.log").read_text(encoding="utf-8")
