"""`serve --keep-alive`: the model is unloaded when no request came for that long, and the next
request loads it again and is answered (the real openai client, a real loopback server)."""

from __future__ import annotations

import argparse
import threading

import openai
import pytest
from server_helpers import raw_request, wait_until

from app.engine import Engine, SamplingParams
from app.engine.keep_alive import ReloadingEngine, parse_keep_alive
from app.errors import QwenTrayError
from app.server import start_server_in_thread

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture
def reloading(tiny_qwen_dir):
    states: list[str] = []
    engine = ReloadingEngine(lambda progress: Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=2,
                                                          max_context=256, progress=progress),
                             keep_alive=None, on_state=states.append)
    engine.states = states
    yield engine
    engine.close()


def ask(client, model: str) -> str:
    response = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=8)
    return response.choices[0].message.content


def test_an_idle_model_is_unloaded_and_the_next_request_loads_it_and_is_answered(reloading):
    handle = start_server_in_thread(reloading, port=0)
    try:
        client = openai.OpenAI(base_url=handle.base_url, api_key="unused", max_retries=0, timeout=120)
        first = ask(client, reloading.model_id)
        reloading.set_keep_alive(0)  # (from here: unloaded as soon as no request runs)
        wait_until(lambda: reloading.states.count("unloaded") == 1, timeout=60, what="the idle model unloaded")
        health = raw_request(handle, "GET", "/health")
        assert health.status == 200 and health.json()["loaded"] is False and health.json()["memory"] is None
        assert ask(client, reloading.model_id) == first  # loaded again, the same greedy answer
        wait_until(lambda: reloading.states.count("unloaded") == 2, timeout=60, what="unloaded again")
    finally:
        handle.stop()
    assert reloading.unloads == 2
    assert reloading.states == ["unloaded", "loading", "ready", "unloaded"]


def test_a_model_in_use_is_not_unloaded(reloading):
    """keep_alive counts from the end of the last request: at 0 s the model goes only once the
    running request has ended, and that request is answered in full."""
    requests, done_at_unload, unloaded = [], [], threading.Event()

    def on_state(state: str) -> None:
        if state == "unloaded":
            done_at_unload.append(requests[-1].done if requests else None)
            unloaded.set()

    reloading.on_state = on_state
    reloading.set_keep_alive(0)
    assert unloaded.wait(60)
    for _ in range(3):
        unloaded.clear()
        requests.append(reloading.chat(MESSAGES, SamplingParams(max_tokens=32, ignore_eos=True)))
        assert requests[-1].result.finish_reason == "length"
        assert unloaded.wait(60)
    assert done_at_unload == [None, True, True, True]


def test_keep_alive_none_never_unloads_and_can_be_changed_live(reloading):
    reloading.set_keep_alive(None)
    reloading.chat(MESSAGES).text()
    assert reloading.is_loaded and reloading.unloads == 0
    reloading.set_keep_alive(0)
    wait_until(lambda: not reloading.is_loaded, timeout=60, what="unloaded once keep-alive is 0")


def test_a_closed_engine_refuses_requests(reloading):
    from app.errors import EngineClosedError

    reloading.close()
    with pytest.raises(EngineClosedError):
        reloading.chat(MESSAGES)


@pytest.mark.parametrize("text,seconds", [("5m", 300), ("90s", 90), ("1h30m", 5400), ("0", 0), ("2.5", 2.5),
                                          ("500ms", 0.5), ("-1", None), ("-1m", None)])
def test_keep_alive_durations_follow_ollama(text, seconds):
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "5x", "m5"])
def test_a_bad_keep_alive_is_named(text):
    with pytest.raises(QwenTrayError, match="--keep-alive"):
        parse_keep_alive(text)


def test_serve_parses_keep_alive_and_defaults_to_ten_minutes(capsys):
    from app.server.cli import add_serve_arguments

    parser = argparse.ArgumentParser(prog="qwen-tray serve")
    add_serve_arguments(parser)
    assert parser.parse_args([]).keep_alive == 600
    assert parser.parse_args(["--keep-alive", "-1"]).keep_alive is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--keep-alive", "soon"])
    assert "argument --keep-alive: 'soon' is not a duration" in capsys.readouterr().err


def test_a_model_folder_gone_at_reload_is_the_servers_503_not_the_clients_400(tmp_path, tiny_qwen_dir):
    """The client did nothing wrong: SDKs retry a 503 (Retry-After), and the message says why."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen_dir, folder)
    engine = ReloadingEngine(lambda progress: Engine.load(folder, device="cpu", max_batch_size=2, max_context=256,
                                                          progress=progress), keep_alive=0)
    handle = start_server_in_thread(engine, port=0)
    try:
        wait_until(lambda: not engine.is_loaded, timeout=60, what="the idle model unloaded")
        shutil.rmtree(folder)
        client = openai.OpenAI(base_url=handle.base_url, api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.InternalServerError) as caught:
            ask(client, engine.model_id)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["Retry-After"]
        body = caught.value.body
        assert body["type"] == "server_error" and body["code"] == "model_load_failed"
        assert body["message"].startswith("The model failed to load: ") and "model folder not found" in body["message"]
    finally:
        handle.stop()
        engine.close()
