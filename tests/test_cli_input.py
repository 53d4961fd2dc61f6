"""What a user pipes into or out of `qwen-tray`: text that is not UTF-8, a reader that stops early."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.commands import text_input

ROOT = Path(__file__).resolve().parents[1]


def qwen_tray(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], env=env, cwd=ROOT, **kwargs)


def test_bytes_that_are_not_utf8_become_replacement_characters_and_the_user_is_told(capsys):
    assert text_input.from_argument("Say \udcff\udcfe hello") == "Say \ufffd\ufffd hello"
    assert "2 invalid sequence(s) were replaced" in capsys.readouterr().err
    assert text_input.from_argument("plain text, 中文") == "plain text, 中文"
    assert capsys.readouterr().err == ""


def test_ask_with_latin1_on_stdin_gives_a_sentence_not_a_traceback(tmp_path):
    """Neither UTF-8 nor the locale's encoding (UTF-8 here): one sentence, nothing guessed
    (tests/test_cli_console.py: a code page that reads it)."""
    proc = qwen_tray("ask", "-", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _out, err = proc.communicate(b"  \xff\xfe  ", timeout=120)
    assert err == b"qwen-tray: error: standard input is not UTF-8 text (byte 0xff at offset 2); convert it to UTF-8 " \
                  b"and try again\n"


def test_a_reader_that_stops_early_is_no_traceback():
    proc = qwen_tray("models", "catalog", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `| head -0` does: nothing will read what it prints
    _out, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"Exception ignored" not in err, err.decode()
    assert proc.returncode == 1
