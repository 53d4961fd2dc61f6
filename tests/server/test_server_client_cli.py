"""`qwen-tray ask --server` (app/remote's client, the one the tray uses for remote models) and the
`qwen-tray serve` command, against real loopback servers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from app.commands.ask import server_base_url
from app.engine import SamplingParams
from app.remote import RemoteClient, RemoteConnectionError, RemoteError
from app.server.sse import iter_event_data
from server_helpers import raw_request, wait_until

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


def _ask(base_url: str, params: SamplingParams, api_key: str = "") -> str:
    with RemoteClient(base_url, api_key) as remote:
        return "".join(remote.chat(remote.first_model(), MESSAGES, params))


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again: nobody listens there


def test_sse_parser_follows_the_spec():
    lines = [b": keep-alive comment\n", b"data: {\"a\": 1}\r\n", b"\r\n", b"event: x\n", b"data: line one\n",
             b"data:line two\n", b"\n", b"data: [DONE]\n"]
    assert list(iter_event_data(lines)) == ['{"a": 1}', "line one\nline two", "[DONE]"]


def test_server_url_becomes_the_api_base_url(server):
    assert server_base_url(server.url) == server.base_url
    assert server_base_url(server.base_url + "/") == server.base_url
    assert server_base_url("127.0.0.1:18000") == "http://127.0.0.1:18000/v1"
    assert server_base_url("https://example.com/api/v1") == "https://example.com/api/v1"


def test_remote_client_streams_the_same_answer(server, client, engine):
    expected = client.chat.completions.create(model=engine.model_id, messages=MESSAGES, temperature=0,
                                              max_tokens=10).choices[0].message.content
    with RemoteClient(server_base_url(server.url)) as remote:
        assert remote.first_model() == engine.model_id
        pieces = list(remote.chat(engine.model_id, MESSAGES, SamplingParams(max_tokens=10, temperature=0)))
    assert len(pieces) > 1 and "".join(pieces) == expected


def test_remote_client_errors_are_one_line_user_errors(make_server, engine):
    handle = make_server(api_key="k")
    with RemoteClient(handle.base_url, "wrong") as remote, pytest.raises(RemoteError) as info:
        remote.first_model()
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    too_long = [{"role": "user", "content": "w " * engine.max_context}]
    with RemoteClient(handle.base_url, "k") as remote, pytest.raises(RemoteError) as info:
        remote.chat(engine.model_id, too_long, SamplingParams(max_tokens=16))
    assert info.value.status == 400 and info.value.code == "context_length_exceeded" and "\n" not in str(info.value)
    assert str(info.value).endswith("Please reduce the length of the messages.")  # the server's words, whole
    with RemoteClient(f"http://127.0.0.1:{_closed_port()}/v1") as remote, \
            pytest.raises(RemoteConnectionError, match="^cannot reach"):
        remote.first_model()


def test_closing_or_cancelling_the_stream_cancels_the_generation(make_server, engine):
    handle = make_server()
    endless = SamplingParams(max_tokens=400, ignore_eos=True)
    with RemoteClient(handle.base_url) as remote:
        deltas = iter(remote.chat(engine.model_id, MESSAGES, endless))
        assert next(deltas)
        deltas.close()  # the user pressed Ctrl+C: the connection closes
        wait_until(lambda: handle.stats()["active"] == 0, what="the request to end")
        assert handle.stats()["disconnects"] == 1 and engine.stats()["running"] == 0

        stream = remote.chat(engine.model_id, MESSAGES, endless)
        for _ in stream:
            stream.cancel()  # the tray's Stop: the socket is shut down
        assert stream.result.finish_reason == "cancelled"
        wait_until(lambda: handle.stats()["active"] == 0, what="the request to end")
        assert handle.stats()["disconnects"] == 2 and engine.stats()["running"] == 0


def test_cli_ask_server(server, engine, capsys):
    from app.cli import main

    expected = _ask(server.base_url, SamplingParams(max_tokens=6, temperature=0))
    assert main(["ask", "--server", server.base_url, "--temperature", "0", "--max-tokens", "6",
                 MESSAGES[0]["content"]]) == 0
    out, err = capsys.readouterr()
    assert out == expected + "\n"
    # an answer the server cut at --max-tokens says so on stderr, as a local `ask` does
    cut = "qwen-tray: the answer stopped at --max-tokens 6; give a larger --max-tokens for more\n"
    assert err == cut  # (the tiny random model does not end its answers by itself)


def test_cli_ask_server_sends_the_model_it_is_given(server, capsys):
    """--model names the server's model: one it does not serve is refused, not silently replaced."""
    from app.cli import main

    assert main(["ask", "--server", server.base_url, "--model", "gpt-4", "--max-tokens", "4", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no model 'gpt-4' (HTTP 404" in err and "check --model" in err


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_cli_ask_server_key_from_the_option_or_the_environment(make_server, capsys, monkeypatch):
    from app.cli import main

    handle = make_server(api_key="k")
    monkeypatch.delenv("QWEN_TRAY_API_KEY", raising=False)
    assert main(["ask", "--server", handle.url, "--max-tokens", "2", "hi"]) == 1
    err = _error_line(capsys)
    assert "refused the API key (HTTP 401" in err and "--api-key or $QWEN_TRAY_API_KEY" in err
    assert main(["ask", "--server", handle.url, "--api-key", "k", "--max-tokens", "2", "hi"]) == 0
    monkeypatch.setenv("QWEN_TRAY_API_KEY", "k")
    assert main(["ask", "--server", handle.url, "--max-tokens", "2", "hi"]) == 0


def test_cli_ask_server_says_what_failed_in_one_line(server, engine, capsys):
    from app.cli import main

    assert main(["ask", "--server", f"http://127.0.0.1:{_closed_port()}", "hi"]) == 1
    assert _error_line(capsys).startswith("qwen-tray: error: cannot reach http://127.0.0.1:")
    assert main(["ask", "--server", server.url, "--max-tokens", "16", "w " * engine.max_context]) == 1
    assert "HTTP 400: This model's maximum context length is" in _error_line(capsys)
    assert main(["ask", "--server", "ftp://127.0.0.1", "hi"]) == 1
    assert "expected a URL like http://127.0.0.1:18000/v1" in _error_line(capsys)


PIECE = b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}\n\n'


def _serve_one_answer(*events: bytes, complete: bool) -> tuple[int, threading.Thread]:
    """A server that answers one request with these SSE events, then closes the connection:
    after the body's last chunk when ``complete``, else in the middle of the body."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        with listener, listener.accept()[0] as conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(body) < length:  # read it all: closing on unread bytes would reset, not end
                body += conn.recv(65536)
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + chunks + (b"0\r\n\r\n" if complete else b""))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


@pytest.mark.parametrize(("events", "complete", "said"), [
    ((PIECE,), False, "lost the connection to {url}: "),
    ((PIECE, b"data: <html>\n\n"), True, "{url} sent what is not the API's JSON ("),
], ids=["connection-broken", "not-json"])
def test_cli_ask_server_says_when_the_stream_broke_mid_answer(capsys, events, complete, said):
    from app.cli import main

    port, server = _serve_one_answer(*events, complete=complete)
    assert main(["ask", "--server", f"http://127.0.0.1:{port}", "--model", "m", "hi"]) == 1
    server.join(timeout=10)
    captured = capsys.readouterr()
    assert captured.out == "Hel"
    assert captured.err.startswith("qwen-tray: error: " + said.format(url=f"http://127.0.0.1:{port}/v1"))
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_cli_ask_server_on_this_machine_bypasses_the_system_proxy(server, capsys, monkeypatch):
    """A proxy's loopback is its own: a local server is asked directly, as before the SDK client."""
    from app.cli import main

    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert main(["ask", "--server", server.base_url, "--max-tokens", "2", "hi"]) == 0
    assert capsys.readouterr().out


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
        answer = _ask(base_url, SamplingParams(max_tokens=4, temperature=0))
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
