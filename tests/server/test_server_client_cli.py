"""The stdlib client (`qwen-tray ask --server`) and the `qwen-tray serve` command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from app.engine import SamplingParams
from app.server.client import ServerConnectionError, ServerRequestError, ask_server
from app.server.sse import iter_event_data
from server_helpers import raw_request, wait_until

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def test_sse_parser_follows_the_spec():
    lines = [b": keep-alive comment\n", b"data: {\"a\": 1}\r\n", b"\r\n", b"event: x\n", b"data: line one\n",
             b"data:line two\n", b"\n", b"data: [DONE]\n"]
    assert list(iter_event_data(lines)) == ['{"a": 1}', "line one\nline two", "[DONE]"]


def test_ask_server_streams_the_same_answer(server, client, engine):
    expected = client.chat.completions.create(model=engine.model_id, messages=MESSAGES, temperature=0,
                                              max_tokens=10).choices[0].message.content
    params = SamplingParams(max_tokens=10, temperature=0, stop=())
    pieces = list(ask_server(server.url, MESSAGES, params))
    assert len(pieces) > 1 and "".join(pieces) == expected
    assert "".join(ask_server(server.base_url + "/", MESSAGES, {"max_tokens": 10, "temperature": 0},
                              model=engine.model_id)) == expected


def test_ask_server_errors_are_one_line_user_errors(make_server, engine):
    handle = make_server(api_key="k")
    with pytest.raises(ServerRequestError) as info:
        list(ask_server(handle.url, MESSAGES, api_key="wrong"))
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    with pytest.raises(ServerRequestError) as info:
        list(ask_server(handle.url, [{"role": "user", "content": "w " * engine.max_context}], api_key="k"))
    assert info.value.code == "context_length_exceeded" and "\n" not in str(info.value)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    with pytest.raises(ServerConnectionError, match="cannot reach"):
        list(ask_server(f"http://127.0.0.1:{free_port}", MESSAGES))


def test_closing_the_client_stream_cancels_the_generation(make_server, engine):
    handle = make_server()
    deltas = ask_server(handle.url, MESSAGES, {"max_tokens": 400, "ignore_eos": True})
    assert next(deltas)
    deltas.close()  # the user pressed Ctrl+C: the connection closes
    wait_until(lambda: handle.stats()["active"] == 0, what="the request to end")
    assert handle.stats()["disconnects"] == 1 and engine.stats()["running"] == 0


def test_cli_ask_server(server, engine, capsys):
    from app.cli import main

    expected = "".join(ask_server(server.url, MESSAGES, {"max_tokens": 6, "temperature": 0}))
    assert main(["ask", "--server", server.base_url, "--temperature", "0", "--max-tokens", "6",
                 MESSAGES[0]["content"]]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_cli_ask_server_sends_the_model_it_is_given(server, capsys):
    """--model names the server's model: one it does not serve is refused, not silently replaced."""
    from app.cli import main

    assert main(["ask", "--server", server.base_url, "--model", "gpt-4", "--max-tokens", "4", "hi"]) == 1
    assert "gpt-4" in capsys.readouterr().err


def _serve(*args: str) -> subprocess.Popen:
    code = "import sys; from app.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", code, "serve", *args], stderr=subprocess.PIPE, text=True,
                            env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def test_cli_serve_refuses_a_public_bind_without_allow_remote(tiny_qwen_dir, capsys):
    from app.cli import main

    assert main(["serve", "--model", str(tiny_qwen_dir), "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert "--allow-remote" in err and "Traceback" not in err


def test_cli_serve_refuses_a_negative_lookup_draft_in_one_line(tiny_qwen_dir, capsys):
    from app.cli import main

    assert main(["serve", "--model", str(tiny_qwen_dir), "--device", "cpu", "--lookup-draft", "-1"]) == 1
    err = capsys.readouterr().err
    assert "qwen-tray: error: --lookup-draft: must be >= 0" in err and "Traceback" not in err
    assert "lookup_draft" not in err  # the option typed, not the engine's keyword


def test_cli_serve_refuses_a_vram_budget_that_is_no_size_on_every_machine(tiny_qwen_dir):
    """Refused by the argument parser, before listening, on the CPU as on the GPU."""
    proc = _serve("--model", str(tiny_qwen_dir), "--device", "cpu", "--port", "0", "--vram-budget", "lots")
    try:
        _out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("serve started with --vram-budget lots")
    assert proc.returncode == 2
    assert "argument --vram-budget: 'lots' is not a size like 3.2GiB" in err and "Traceback" not in err
    assert "serving on" not in err


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name == "nt", reason="POSIX signals")
def test_cli_serve_loads_serves_and_stops_on_sigterm(tiny_qwen_dir):
    proc = _serve("--model", str(tiny_qwen_dir), "--port", "0", "--device", "cpu", "--model-id", "tiny",
                  "--max-batch-size", "2")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("ready:" in line for line in lines) or proc.poll() is not None, timeout=90,
                   what="the server to load")
        ready = next(line for line in lines if "ready:" in line)
        base_url = ready.split("OpenAI base URL ")[1].split()[0]
        answer = "".join(ask_server(base_url, MESSAGES, {"max_tokens": 4, "temperature": 0}))
        assert answer
        host_port = base_url.split("//")[1].split("/")[0]

        class Handle:
            host, port = host_port.split(":")[0], int(host_port.split(":")[1])

        health = raw_request(Handle, "GET", "/health").json()
        assert health["state"] == "ready" and health["model"] == "tiny" and health["max_batch_size"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=5)
    assert proc.returncode == 0, "".join(lines)
    assert json.dumps(lines).count("Traceback") == 0


def test_cli_serve_defaults_to_four_requests_and_fits_only_without_flags(tiny_qwen_dir):
    import argparse

    from app.server.cli import DEFAULT_BATCH, _load_engine, add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--device", "cpu"])
    assert args.max_batch_size is None and args.max_context is None  # so the load may be fitted to the GPU
    args.model_path, args.model_name = str(tiny_qwen_dir), "tiny"
    with _load_engine(args) as engine:
        assert engine.max_batch_size == DEFAULT_BATCH == 4


@pytest.mark.parametrize(("flag", "value", "minimum"), [("--max-batch-size", "0", 1), ("--max-batch-size", "-3", 1),
                                                        ("--max-context", "1", 2)])
def test_cli_serve_refuses_a_zero_batch_or_context_before_listening(tiny_qwen_dir, capsys, flag, value, minimum):
    """0 used to mean "the default" silently (4 requests); now it is an error naming the flag."""
    from app.cli import main

    with pytest.raises(SystemExit) as info:
        main(["serve", "--model", str(tiny_qwen_dir), "--device", "cpu", flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be >= {minimum}, got {value}" in err and "Traceback" not in err
