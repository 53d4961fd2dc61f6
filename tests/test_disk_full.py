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


def _on_small_disk(mount: Path, *argv: str, home: Path, size_mb: int = TMPFS_MB) -> subprocess.CompletedProcess:
    """``argv`` run with a ``size_mb`` tmpfs mounted at ``mount`` (seen by that process only)."""
    mount.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={size_mb}m tmpfs "$1" && shift && exec "$@"'
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


# The tiny model's checkpoint: two small layer files, then ~20 MB of embedding tables.
QUANTIZE_TMPFS_MB = 2
LIST_OUT = "import os, sys; print(sorted(os.listdir(sys.argv[1])))"


@needs_tmpfs
def test_quantize_checks_the_free_space_before_the_first_layer(tmp_path, tiny_qwen_dir):
    disk = tmp_path / "disk"
    quantize = f"{sys.executable} -m app.cli quantize --model {tiny_qwen_dir} --recipe w4 --method rtn --out {disk}/q"
    proc = _on_small_disk(disk, "sh", "-c", f'{quantize}; echo "exit $?"; ls -A "$0"', str(disk),
                          home=tmp_path / "home", size_mb=QUANTIZE_TMPFS_MB)
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"qwen-tray: error: not enough disk space for quantizing {tiny_qwen_dir.name} into "
                               f"{disk / 'q'}: it needs ")
    assert lines[0].endswith("free some space and try again")
    assert proc.stdout.splitlines() == ["exit 1"]  # nothing written


@needs_tmpfs
def test_a_disk_that_fills_up_while_quantizing_is_one_sentence_and_keeps_the_finished_layers(tmp_path, tiny_qwen_dir):
    """Past the check (another program filled the disk meanwhile): a file's write fails with ENOSPC;
    with room made (the tmpfs grown), the same command resumes after the finished layers."""
    disk = tmp_path / "disk"
    past_the_check = ("import sys, app.disk_space; app.disk_space.MARGIN_BYTES = -2**60; from app.cli import main; "
                      "sys.exit(main())")
    quantize = (f'{sys.executable} -c "{past_the_check}" quantize --model {tiny_qwen_dir} --recipe w4 --method rtn '
                f'--out "$0/q"')
    script = (f'{quantize}; echo "exit $?"; {sys.executable} -c "{LIST_OUT}" "$0/q"; '
              f'mount -o remount,size=64m "$0" && {quantize} 2>&1 | grep -E "^(resuming|wrote)"')
    proc = _on_small_disk(disk, "sh", "-c", script, str(disk), home=tmp_path / "home", size_mb=QUANTIZE_TMPFS_MB)
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("qwen-tray:")]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0] == (f"qwen-tray: error: cannot write the checkpoint {disk / 'q'}: the disk is full (No space "
                        "left on device); its 2 finished files are kept: free some space, then running the same "
                        "quantization again resumes")
    out = proc.stdout.splitlines()
    assert out[:3] == ["exit 1", str([".quantize-journal.json", "layer_000.safetensors", "layer_001.safetensors"]),
                       "resuming: 2 of 3 files are already done"]  # no half-written file; then resumed
    assert out[3].startswith(f"wrote {disk / 'q'}: recipe w4, method rtn")


def _starter_gguf_name() -> str:
    from app.engine.gguf_import import find_starter_gguf

    return find_starter_gguf().name


def test_the_tray_log_file_on_a_full_disk_warns_once_and_stops(tmp_path):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (home / "data" / "qwen-tray.log").symlink_to("/dev/full")  # every write: ENOSPC
    code = ("import logging\n"
            "from app.ui.launch import _log_to_file\n"
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
            "from app.ui.launch import _log_to_file\n"
            "handler = _log_to_file()\n"
            "logging.getLogger('app.test').warning('written')\n")
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "WARNING app.test: written" in (home / "data" / "qwen-tray.log").read_text(encoding="utf-8")
