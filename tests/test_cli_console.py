"""What Windows hands the CLI, reproduced on Linux with the same mechanism: no console at all
(pythonw.exe: ``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` are None), output to a pipe or a
file in the ANSI code page with ``errors="strict"`` (``PYTHONIOENCODING=cp936:strict`` /
``cp1252:strict``), standard input in GBK, UTF-16 or with a byte order mark."""

from __future__ import annotations

import codecs
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.commands import text_input
from app.errors import QwenTrayError

ROOT = Path(__file__).resolve().parents[1]
# pythonw.exe: a GUI-subsystem Python, no console; its streams are None (Python docs, sys.__stdout__).
PYTHONW = ("import sys\n"
           "sys.stdin = sys.stdout = sys.stderr = None\n"
           "from app.cli import main\n"
           "sys.exit(main(sys.argv[1:]))\n")
NOT_RUNNING = "Qwen Tray is not running: start it first"


def run(code_or_module: list[str], home: Path, encoding: str | None = None, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen"}
    env.pop("PYTHONIOENCODING", None)
    if encoding:
        env["PYTHONIOENCODING"] = encoding
    return subprocess.run([sys.executable, *code_or_module], input=stdin, capture_output=True, env=env, cwd=ROOT,
                          timeout=120)


def pythonw(home: Path, *args: str) -> subprocess.CompletedProcess:
    return run(["-c", PYTHONW, *args], home)


def log_text(home: Path) -> str:
    log = home / "data" / "qwen-tray.log"
    return log.read_text(encoding="utf-8") if log.exists() else ""


# -- pythonw: no console ------------------------------------------------------------------------
def test_without_a_console_a_command_that_works_exits_0(tmp_path):
    done = pythonw(tmp_path, "action", "--list")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")  # (was: AttributeError on flush, 1)
    assert log_text(tmp_path) == ""  # nothing went wrong: nothing is logged


def test_without_a_console_an_error_goes_to_the_log_and_the_status_is_1(tmp_path):
    done = pythonw(tmp_path, "action", "summarize", "--text", "你好")
    assert (done.returncode, done.stdout, done.stderr) == (1, b"", b"")
    lines = log_text(tmp_path).splitlines()
    assert len(lines) == 1 and f"qwen-tray: error: {NOT_RUNNING}" in lines[0]
    assert " STDERR qwen-tray (process " in lines[0]  # whose line it is, beside the tray's own records

    no_stdin = pythonw(tmp_path, "ask", "-")
    assert no_stdin.returncode == 1
    assert "error: '-' reads standard input, and this process has none" in log_text(tmp_path).splitlines()[-1]


def test_under_pythonw_the_trays_log_holds_each_record_once(tmp_path):
    """The CLI's logging goes to the stand-in for stderr, i.e. the log file; once the tray's own
    handler writes that file, the stand-in's handler is dropped."""
    code = ("import logging, sys\n"
            "sys.stdout = sys.stderr = None\n"
            "from app.commands.console_streams import prepare_streams\n"
            "prepare_streams()\n"
            "assert sys.stderr.encoding == 'utf-8' and not sys.stderr.isatty()\n"
            "logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')\n"
            "logging.getLogger('app.test').warning('before the tray')\n"
            "from app.ui.launch import _log_to_file\n"
            "_log_to_file()\n"
            "logging.getLogger('app.test').warning('from the tray')\n")
    assert run(["-c", code], tmp_path).returncode == 0
    text = log_text(tmp_path)
    assert text.count("before the tray") == 1 and text.count("from the tray") == 1


# -- output in a code page that lacks a character -----------------------------------------------
def user_action(home: Path, name_zh: str) -> None:
    (home / "config").mkdir(parents=True)
    (home / "config" / "settings.json").write_text(json.dumps(
        {"version": 2, "actions": [{"id": "user-check", "name": "Check ✓", "name_zh": name_zh,
                                    "prompt": "Check: {text}"}]}), encoding="utf-8")


@pytest.mark.parametrize("encoding", ["cp936:strict", "cp1252:strict"])
def test_a_listing_redirected_in_a_code_page_that_lacks_a_character_shows_a_question_mark(tmp_path, encoding):
    user_action(tmp_path, "检查 ✓")
    done = run(["-m", "app.cli", "action", "--list"], tmp_path, encoding)
    assert (done.returncode, done.stderr) == (0, b"")
    out = done.stdout.decode(encoding.split(":")[0])
    if encoding.startswith("cp936"):  # GBK has the Chinese, not the check mark
        assert "Summarize / 总结" in out and "user-check  Check ? / 检查 ?" in out
    else:
        assert "Summarize / ??" in out and "user-check  Check ? / ?? ?" in out


def test_an_error_in_a_code_page_that_lacks_its_characters_is_still_one_line(tmp_path):
    """stderr keeps Python's own "backslashreplace" (what it always uses there): escapes, not a traceback."""
    done = run(["-m", "app.cli", "action", "不存在", "--text", "x"], tmp_path, "cp1252:strict")
    assert done.returncode == 1
    assert done.stderr == (b"qwen-tray: error: there is no action '\\u4e0d\\u5b58\\u5728' (`qwen-tray action --list` "
                           b"shows them)\n")


def test_an_answer_redirected_in_cp936_keeps_streaming_past_an_emoji(tmp_path):
    """`qwen-tray ask ... > answer.txt` on Chinese Windows: the real CLI and its stream, a model
    answering with an emoji."""
    code = ("import sys\n"
            "from app.commands import ask\n"
            "ask.run = lambda args: ask._stream(iter(['好的', '，已完成 ', '👍', ' 谢谢']))\n"
            "from app.cli import main\n"
            "sys.exit(main(['ask', 'hi']))\n")
    done = run(["-c", code], tmp_path, "cp936:strict")
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.decode("cp936") == "好的，已完成 ? 谢谢\n"


# -- standard input: GBK, UTF-16, a byte order mark ---------------------------------------------
SENTENCE = "请总结这段话：明天下午三点开会。\r\n"


def test_gbk_text_is_read_in_the_systems_code_page():
    """`echo ... | qwen-tray action summarize -` in cmd.exe on Chinese Windows (or a Notepad "ANSI" file)."""
    assert text_input.decode_input(SENTENCE.encode("gbk"), "cp936") == SENTENCE
    assert text_input.decode_input(SENTENCE.encode("utf-8"), "cp936") == SENTENCE  # UTF-8 first


@pytest.mark.parametrize("raw", [codecs.BOM_UTF8 + SENTENCE.encode("utf-8"), SENTENCE.encode("utf-16"),
                                 codecs.BOM_UTF16_BE + SENTENCE.encode("utf-16-be")],
                         ids=["utf-8 with a byte order mark", "utf-16-le", "utf-16-be"])
def test_a_byte_order_mark_says_the_encoding_and_is_dropped(raw, monkeypatch):
    """Notepad's "UTF-8 with BOM" and "Unicode", Windows PowerShell 5.1's `>`: read through the real stdin path."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert text_input.from_stdin() == SENTENCE


@pytest.mark.parametrize("raw, fallback, said", [
    (b"ab\x80\xffcd", "cp936", "standard input is neither UTF-8 text (byte 0x80 at offset 2) nor cp936 text, "
                               "this system's code page; convert it to UTF-8 and try again"),
    (b"ab\xffcd", "utf-8", "standard input is not UTF-8 text (byte 0xff at offset 2); convert it to UTF-8 and "
                           "try again"),
    (codecs.BOM_UTF8 + b"ab\xff", "cp936", "standard input starts with UTF-8's byte order mark but is not UTF-8 "
                                           "text (byte 0xff at offset 5); convert it to UTF-8 and try again"),
])
def test_text_no_encoding_tried_can_read_is_one_sentence_naming_them(raw, fallback, said):
    with pytest.raises(QwenTrayError) as refused:
        text_input.decode_input(raw, fallback)
    assert str(refused.value) == said


def test_the_cli_reads_a_utf16_file_and_refuses_bytes_it_cannot_read_in_one_line(tmp_path):
    """Through the real CLI (`ask -` reads the prompt, then finds no model: the prompt was read)."""
    read = run(["-m", "app.cli", "ask", "-"], tmp_path, stdin=SENTENCE.encode("utf-16"))
    assert read.returncode == 1 and b"models add-starter" in read.stderr and b"UTF" not in read.stderr
    refused = run(["-m", "app.cli", "ask", "-"], tmp_path, stdin=b"\xfe\x00\x80\x80")
    assert refused.returncode == 1 and refused.stderr.count(b"\n") == 1
    assert refused.stderr.startswith(b"qwen-tray: error: standard input is not")
