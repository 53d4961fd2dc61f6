"""Progress while loading: what `ask` and `serve` print on stderr, and the kernel builds' count
(app.kernels.builds) that the tray shows as a percentage."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

import pytest

from app import progress as progress_mod
from app.kernels.builds import FIRST_BUILD_ESTIMATE, BuildProgress, BuildRecord
from app.progress import (
    GPU_STAGE,
    KERNELS_STAGE,
    LAYERS_STAGE,
    BarProgress,
    LineProgress,
    load_progress_bar,
)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# -- on stderr -------------------------------------------------------------------------------------

def test_a_log_gets_one_line_per_stage_once_the_work_takes_more_than_a_moment():
    out, clock = io.StringIO(), Clock()
    lines = LineProgress("loading m", out, delay=1.0, clock=clock)
    lines(LAYERS_STAGE, 1, 30)
    clock.now = 0.5
    lines(LAYERS_STAGE, 10, 30)
    assert out.getvalue() == ""  # quick work shows nothing
    clock.now = 1.5
    lines(LAYERS_STAGE, 20, 30)
    lines(LAYERS_STAGE, 30, 30)
    lines(KERNELS_STAGE, 0, 40)
    lines(KERNELS_STAGE, 12, 40)
    assert out.getvalue().splitlines() == ["loading m: layers (20/30)",
                                           "loading m: building GPU kernels (first run) (0/40)"]


def test_a_log_gets_a_line_per_tenth_of_one_long_piece_of_work():
    """A conversion's 272 tensors: eleven lines, by the amount done (not one line stuck at 1/272)."""
    out = io.StringIO()
    lines = LineProgress("converting m", out, delay=0, clock=Clock(), steps=10)
    for done in range(1, 273):
        lines("tensors", done, 272)
    assert out.getvalue().splitlines() == [f"converting m: tensors ({done}/272)"
                                           for done in (1, 28, 55, 82, 109, 136, 164, 191, 218, 245, 272)]


def test_a_terminal_gets_a_bar_after_the_moment():
    out, clock = Terminal(), Clock()
    bar = BarProgress("loading m", out, delay=1.0, clock=clock)
    bar(LAYERS_STAGE, 3, 30)
    assert out.getvalue() == "" and bar.bar is None
    clock.now = 2.0
    bar(LAYERS_STAGE, 15, 30)
    bar(KERNELS_STAGE, 5, 40)
    bar.close()
    text = out.getvalue()
    assert "loading m" in text and "15/30" in text and "building GPU kernels (first run)" in text and "5/40" in text


def test_a_bar_that_starts_midway_measures_its_rate_from_its_own_work(monkeypatch):
    """A resumed quantization's bar starts at the files already done: 25/31 with no rate, then
    1 file in 10 s is 10 s/file and 50 s left (not 26 files in 10 s: the finished ones were only skipped)."""
    import tqdm.std

    now = [100.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])  # tqdm's clock, read as each bar is made
    out = Terminal()
    bar = BarProgress("quantizing m", out, delay=0, clock=Clock())
    bar("layer_025.safetensors", 25, 31)
    assert "25/31" in out.getvalue() and "?it/s" in out.getvalue()
    now[0] += 10.0
    bar("layer_026.safetensors", 26, 31)
    bar.close()
    assert "26/31 [00:10<00:50, 10.00s/it" in out.getvalue(), out.getvalue()


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_load_progress_bar_picks_lines_for_a_pipe_and_a_bar_for_a_terminal():
    with load_progress_bar("x", file=io.StringIO(), delay=0) as reporter:
        assert type(reporter) is LineProgress
    with _pseudo_terminal(columns=80) as terminal, load_progress_bar("x", file=terminal, delay=0) as reporter:
        assert type(reporter) is BarProgress
    with _pseudo_terminal(columns=0) as terminal, load_progress_bar("x", file=terminal, delay=0) as reporter:
        assert type(reporter) is LineProgress  # `script` from a service: tqdm would draw nothing at 0 columns


@contextlib.contextmanager
def _pseudo_terminal(columns: int):
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24 if columns else 0, columns, 0, 0))
        with os.fdopen(follower, "w", closefd=False) as file:
            yield file
    finally:
        os.close(leader)
        os.close(follower)


def test_ask_says_what_it_loads_on_stderr(cli, tiny_qwen_dir, monkeypatch):
    monkeypatch.setattr(progress_mod, "PROGRESS_DELAY_S", 0.0)  # (a tiny model loads in a moment)
    proc = cli("ask", "--model", str(tiny_qwen_dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "2",
               "Hello")
    assert proc.returncode == 0, proc.stderr
    assert f"loading {tiny_qwen_dir.name}: layers (" in proc.stderr
    assert "layers" not in proc.stdout  # the answer stays clean


def test_serve_says_what_it_loads_on_stderr(tiny_qwen_dir, monkeypatch, capsys):
    from app.server.cli import _load_engine

    monkeypatch.setattr(progress_mod, "PROGRESS_DELAY_S", 0.0)
    args = argparse.Namespace(model_path=tiny_qwen_dir, model_name=tiny_qwen_dir.name, device="cpu", max_batch_size=1, max_context=64,
                              vram_budget=None, lookup_draft=None, keep_alive=None, verify=False)
    engine = _load_engine(args)
    engine.close()
    assert f"loading {tiny_qwen_dir.name}: layers (" in capsys.readouterr().err


# -- kernel builds -------------------------------------------------------------------------------

def reports() -> tuple[list, callable]:
    seen: list[tuple[str, int, int]] = []
    return seen, lambda stage, done, total: seen.append((stage, done, total))


def test_a_first_build_on_a_new_machine_counts_against_the_estimate_and_ends_at_100(tmp_path):
    seen, progress = reports()
    watcher = BuildProgress(BuildRecord.read("k1", tmp_path), progress)
    watcher.start()
    for i in range(FIRST_BUILD_ESTIMATE + 5):  # more instances than guessed
        watcher("gemv.cu", f"gemv_kernel<{i}>")
    assert all(stage == KERNELS_STAGE and done < total for stage, done, total in seen)  # never 100% early
    watcher.finish()
    assert seen[-1] == (KERNELS_STAGE, FIRST_BUILD_ESTIMATE, FIRST_BUILD_ESTIMATE)
    saved = json.loads((tmp_path / "built-k1.json").read_text())["instances"]
    assert len(saved) == FIRST_BUILD_ESTIMATE + 5 and "gemv.cu:gemv_kernel<0>" in saved


def test_a_recorded_build_is_cached_and_its_count_is_exact(tmp_path):
    first = BuildProgress(BuildRecord.read("k1", tmp_path), None)
    for name in ("a", "b", "c"):
        first("x.cu", name)
    first.finish()
    seen, progress = reports()
    again = BuildProgress(BuildRecord.read("k1", tmp_path), progress)
    again.start()
    again("x.cu", "a")
    again.finish()
    assert seen == [(GPU_STAGE, 0, 3), (GPU_STAGE, 1, 3), (GPU_STAGE, 3, 3)]


def test_a_build_after_the_kernels_changed_expects_the_last_builds_count(tmp_path):
    old = BuildProgress(BuildRecord.read("old", tmp_path), None)
    for i in range(7):
        old("x.cu", str(i))
    old.finish()
    record = BuildRecord.read("new", tmp_path)
    assert not record.cached and record.expected() == 7


@pytest.mark.parametrize("content", ["not json", '{"instances": 3}', "[]"])
def test_an_unreadable_record_is_a_first_build(tmp_path, content):
    (tmp_path / "built-k.json").write_text(content)
    record = BuildRecord.read("k", tmp_path)
    assert not record.cached and record.expected() == FIRST_BUILD_ESTIMATE


def test_the_build_key_follows_the_kernel_sources_options_gpu_and_compiler():
    from app.kernels.builds import build_key

    key = build_key((8, 6), "cupy-cuda12x 13.3.0")
    assert key == build_key((8, 6), "cupy-cuda12x 13.3.0")
    assert len({key, build_key((9, 0), "cupy-cuda12x 13.3.0"), build_key((8, 6), "cupy-cuda12x 13.4.0")}) == 3


@pytest.mark.gpu
def test_a_gpu_load_reports_its_kernel_builds_then_finds_them_cached(tmp_path, tiny_qwen_kernel_dir, monkeypatch):
    """A fresh CuPy cache: the first load compiles (KERNELS_STAGE, counted, recorded); a load in
    a new process then finds the record (GPU_STAGE, the exact count)."""
    import os
    import subprocess
    import sys

    code = ("import json, sys\nfrom app.engine import Engine\nseen = []\n"
            "e = Engine.load(sys.argv[1], device='cuda', max_batch_size=1, max_context=256,"
            " progress=lambda *a: seen.append(a))\ne.close()\n"
            "print(json.dumps([s for s in seen if s[0] != 'layers']))")
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path / "cupy"), "QWEN_TRAY_HOME": str(tmp_path / "home")}
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code, str(tiny_qwen_kernel_dir)], capture_output=True, text=True,
                              env=env, timeout=900, check=False)
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert {s[0] for s in first} == {KERNELS_STAGE} and first[-1][1] == first[-1][2]
    assert {s[0] for s in second} == {GPU_STAGE} and second[-1][1] == second[-1][2]
    assert list((tmp_path / "home" / "cache" / "kernels").glob("built-*.json"))
