"""Ctrl+C in `qwen-tray quantize` (a real SIGINT to a real process): one sentence saying what
stays, exit 130, no half-written file; the same command then resumes from the finished layers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.formats.checkpoint import layer_file
from tests.conftest import build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYERS = 48


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory, qwen_tokenizer_dir) -> Path:
    """Many small layers: the quantizer is still at work when the test presses Ctrl+C."""
    return build_tiny_model(tmp_path_factory.mktemp("deep") / "Deep", qwen_tokenizer_dir, "qwen2",
                            num_hidden_layers=LAYERS, tie_word_embeddings=True)


def test_ctrl_c_keeps_the_finished_layers_and_the_same_command_resumes(deep_model, tmp_path):
    out = tmp_path / "ckpt"
    command = [sys.executable, "-m", "app.cli", "quantize", "--model", str(deep_model), "--recipe", "w4",
               "--method", "rtn", "--out", str(out)]
    env = {**os.environ, "QWEN_TRAY_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(command, env=env, cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # stderr is a pipe, as in a log: a line per tenth of the files; the second comes once
        # a tenth of them is written
        lines = [proc.stderr.readline(), proc.stderr.readline()]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    files, tenth = LAYERS + 1, -(-(LAYERS + 1) // 10)  # the layers and the tables
    assert lines == [f"quantizing Deep: {layer_file(0)} (0/{files})\n",
                     f"quantizing Deep: {layer_file(tenth)} ({tenth}/{files})\n"]
    assert proc.returncode == 130 and "Traceback" not in err
    finished = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(finished) >= files // 10 and "embeddings.safetensors" not in finished
    assert err.splitlines()[-1] == (f"qwen-tray: stopped: {out} is not a usable checkpoint yet (no manifest); its "
                                    f"{len(finished)} finished files are kept and running the same command resumes "
                                    "from them")
    assert not (out / "manifest.json").exists() and not list(out.glob(".*.tmp"))  # nothing half-written
    kept = {name: (out / name).stat().st_ino for name in finished}
    ask = subprocess.run([sys.executable, "-m", "app.cli", "ask", "--model", str(out), "hi"], env=env, cwd=REPO_ROOT,
                         text=True, capture_output=True, timeout=300)
    assert ask.returncode == 1 and ask.stderr.splitlines() == [  # not "quantize the model again"
        f"qwen-tray: error: the manifest {out / 'manifest.json'} is missing (an unfinished quantization "
        "(.quantize-journal.json is there): run the command that started it (`qwen-tray quantize`, `models get`) "
        "again and it resumes from the finished layers)"]

    again = subprocess.run(command, env=env, cwd=REPO_ROOT, text=True, capture_output=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"wrote {out}" in again.stdout
    resumed = again.stderr.splitlines()
    assert resumed[0] == f"resuming: {len(finished)} of {files} files are already done"
    # the count goes on from the finished files (not from 0/49 as if they were quantized again)
    assert resumed[1] == f"quantizing Deep: {layer_file(len(finished))} ({len(finished)}/{files})", again.stderr
    assert {name: (out / name).stat().st_ino for name in finished} == kept  # resumed: not written again


def test_a_second_quantize_into_the_same_folder_is_refused_while_the_first_runs(deep_model, tmp_path):
    out = tmp_path / "ckpt"
    command = [sys.executable, "-m", "app.cli", "quantize", "--model", str(deep_model), "--recipe", "w4",
               "--out", str(out)]
    env = {**os.environ, "QWEN_TRAY_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO_ROOT)}
    first = subprocess.Popen([*command, "--method", "rtn"], env=env, cwd=REPO_ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert first.stderr.readline().startswith("quantizing Deep: ")  # it is writing now
        first.send_signal(signal.SIGSTOP)  # and stays at it (a big model's layers take minutes)
        seconds = [subprocess.run([*command, "--method", method], env=env, cwd=REPO_ROOT, text=True,
                                  capture_output=True, timeout=300) for method in ("rtn", "search")]
        first.send_signal(signal.SIGINT)  # (handled as it wakes: before it could finish)
        first.send_signal(signal.SIGCONT)
        first.communicate(timeout=120)
    finally:
        first.kill()
    for second in seconds:  # neither "resuming" the running one nor "holds an unfinished quantization with ..."
        assert second.returncode == 1 and second.stderr.splitlines() == [
            f"qwen-tray: error: another qwen-tray quantize is writing {out} (process {first.pid}); wait for it to "
            "finish, or stop it and run this again"], second.stderr
    assert subprocess.run([*command, "--method", "rtn"], env=env, cwd=REPO_ROOT, text=True, capture_output=True,
                          timeout=600).returncode == 0  # once it stopped, the same command resumes its work
