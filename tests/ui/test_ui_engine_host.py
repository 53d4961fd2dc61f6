"""The engine host: loading and switching models on a worker thread, never freezing the UI."""

from __future__ import annotations

import threading

from PySide6.QtCore import QTimer
from ui_fakes import FakeOpener

from app.ui.controllers.engine_host import EngineHost
from app.ui.controllers.tasks import StreamTask
from app.ui.models import ModelEntry

A = ModelEntry("model-a", path="/models/a")
B = ModelEntry("model-b", path="/models/b")
C = ModelEntry("model-c", path="/models/c")


def test_load_reports_progress_and_keeps_the_event_loop_running(qtbot):
    gate = threading.Event()
    opener = FakeOpener(gate=gate)
    host = EngineHost(opener)
    progress = []
    host.loadProgress.connect(lambda stage, done, total: progress.append((stage, done, total)))
    ticks = []
    timer = QTimer(interval=5, timeout=lambda: ticks.append(1))
    timer.start()
    host.switch_to(A)
    assert host.state == "loading" and host.backend is None
    qtbot.waitUntil(lambda: len(ticks) >= 3)  # the UI thread keeps running while the load is held
    assert host.state == "loading"
    with qtbot.waitSignal(host.loaded, timeout=5000):
        gate.set()
    timer.stop()
    assert host.state == "ready" and host.backend.name == "model-a"
    assert progress == [("loading weights", 0, 3), ("loading weights", 1, 3), ("loading weights", 2, 3)]


def test_switch_closes_the_old_model_before_opening_the_new_one(qtbot):
    opener = FakeOpener()
    host = EngineHost(opener)
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(A)
    old = host.backend
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(B)
    assert old.closed
    assert opener.log == [("open", "model-a"), ("close", "model-a"), ("open", "model-b")]
    assert host.backend.name == "model-b" and host.entry == B


def test_switches_during_a_load_are_queued_and_the_last_wins(qtbot):
    gate = threading.Event()
    opener = FakeOpener(gate=gate)
    host = EngineHost(opener)
    host.switch_to(A)
    host.switch_to(B)
    host.switch_to(C)
    gate.set()
    qtbot.waitUntil(lambda: host.state == "ready" and host.entry == C, timeout=5000)
    assert opener.log == [("open", "model-a"), ("close", "model-a"), ("open", "model-c")]
    assert host.backend.name == "model-c"


def test_unload_closes_the_model_and_loads_none(qtbot):
    opener = FakeOpener()
    host = EngineHost(opener)
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(A)
    with qtbot.waitSignal(host.unloaded, timeout=5000):
        host.unload()
        assert host.state == "empty" and host.entry is None and host.backend is None  # at once
    assert opener.log == [("open", "model-a"), ("close", "model-a")]
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(B)  # a later switch loads as usual
    assert host.backend.name == "model-b"


def test_unload_during_a_load_closes_that_model_when_it_is_in(qtbot):
    gate = threading.Event()
    opener = FakeOpener(gate=gate)
    host = EngineHost(opener)
    loaded = []
    host.loaded.connect(lambda: loaded.append(host.entry))
    host.switch_to(A)
    host.unload()
    with qtbot.waitSignal(host.unloaded, timeout=5000):
        gate.set()
    assert opener.log == [("open", "model-a"), ("close", "model-a")]
    assert loaded == [] and host.state == "empty" and host.backend is None


def test_a_failed_load_is_an_error_state_with_the_message(qtbot):
    host = EngineHost(FakeOpener(fail={"model-b"}))
    with qtbot.waitSignal(host.loadFailed, timeout=5000) as failed:
        host.switch_to(B)
    assert failed.args == ["model-b: config.json not found"]
    assert host.state == "error" and host.backend is None
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(A)  # recovers by loading another model
    assert host.state == "ready"


def test_busy_while_a_request_runs_and_switch_cancels_it(qtbot):
    gate = threading.Event()
    host = EngineHost(FakeOpener(gate=None))
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(A)
    backend = host.backend
    backend.gate = gate  # tokens wait: the request stays running
    stream_box = {}

    def job(sink):
        stream = backend.chat([{"role": "user", "content": "hello there"}], None, 10)
        stream_box["s"] = stream
        for d in stream:
            sink.on_delta(d)
        return stream.result

    task = StreamTask(job, lambda: stream_box["s"].cancel())
    results = []
    task.finished.connect(results.append)
    host.track(task)
    task.start()
    assert host.busy
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(B)
    # `finished` and then `ended` arrive as two queued signals: busy clears with the second.
    qtbot.waitUntil(lambda: bool(results) and not host.busy, timeout=5000)
    assert results[0].finish_reason == "cancelled"
    assert backend.closed


def test_stream_task_signals_arrive_on_the_ui_thread(qtbot):
    main = threading.current_thread()
    seen = []
    task = StreamTask(lambda sink: (sink.on_delta("x"), sink.on_progress("part", 1, 2))[0] or "done", lambda: None)
    task.delta.connect(lambda d: seen.append(("delta", threading.current_thread() is main)))
    task.progress.connect(lambda *a: seen.append(("progress", threading.current_thread() is main)))
    with qtbot.waitSignal(task.ended, timeout=5000):
        task.start()
    assert seen == [("delta", True), ("progress", True)]


def test_shutdown_closes_the_model(qtbot):
    host = EngineHost(FakeOpener())
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(A)
    backend = host.backend
    host.shutdown()
    assert backend.closed and host.state == "empty"


def test_shutdown_during_a_load_closes_what_the_load_brings(qtbot):
    gate = threading.Event()
    opener = FakeOpener(gate=gate)
    host = EngineHost(opener)
    host.switch_to(A)
    threading.Timer(0.05, gate.set).start()
    host.shutdown()
    assert opener.backends and opener.backends[0].closed
    assert host.backend is None
