"""A hotkey pressed while the model loads (right after login, or during a model switch): the
selection is copied at the press, the popup says what it waits for, and the answer is about that
text even if the user has selected something else by the time the model is ready."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtGui import QGuiApplication
from ui_fakes import FakeOpener, RecordingInjector

from app.ui.actions import load_builtin_actions
from app.ui.controllers.action_controller import ActionController
from app.ui.controllers.engine_host import EngineHost
from app.ui.models import ModelEntry
from app.ui.preferences import Preferences

SELECTED = "The quarterly review moved from Tuesday to Friday at ten."


@pytest.fixture
def clipboard(qapp):
    cb = QGuiApplication.clipboard()
    cb.setText("the user's own clipboard")
    yield cb
    cb.clear()


@pytest.fixture
def gate():
    gate = threading.Event()
    yield gate
    gate.set()


def _loading_host(qtbot, opener):
    host = EngineHost(opener)
    host.switch_to(ModelEntry("Qwen2.5-3B-Instruct", path="/fake"))
    qtbot.waitUntil(lambda: host.progress[2] == 3, timeout=5000)  # the load reports, and is held
    return host


def _controller(host, clipboard):
    injector = RecordingInjector(clipboard, SELECTED)
    prefs = Preferences()
    return ActionController(host, lambda: prefs, injector, clipboard, load_builtin_actions), injector


def test_the_selection_is_copied_at_the_press_and_answered_once_loaded(qtbot, clipboard, gate):
    host = _loading_host(qtbot, FakeOpener(gate))
    controller, injector = _controller(host, clipboard)
    notices = []
    controller.notify.connect(notices.append)
    with qtbot.waitSignal(controller.started, timeout=5000) as started:
        controller.run_action("summarize")
    assert started.args[0].origin == "selection" and started.args[0].text == SELECTED
    assert "Ctrl+C" in injector.sent and notices == []  # copied now; no "no model is ready"
    popup = controller.popup
    assert popup.isVisible() and popup.status.text().startswith("Loading Qwen2.5-3B-Instruct…")
    assert popup.stop_button.isEnabled() and not popup.replace_button.isEnabled()
    assert clipboard.text() == "the user's own clipboard"  # restored while the model loads

    injector.selection = "Something the user selected afterwards."  # the user has moved on
    with qtbot.waitSignal(controller.answered, timeout=10000) as answered:
        gate.set()
    assert host.backend.requests[0][0][-1]["content"].endswith(SELECTED)
    assert popup.answer_text() == answered.args[0] and popup.replace_button.isEnabled()
    assert injector.sent.count("Ctrl+C") == 1  # not copied a second time when the load ended
    host.shutdown()


def test_a_load_that_fails_says_why_in_the_waiting_popup(qtbot, clipboard, gate):
    opener = FakeOpener(gate, fail={"Qwen2.5-3B-Instruct"})
    host = _loading_host(qtbot, opener)
    controller, _ = _controller(host, clipboard)
    with qtbot.waitSignal(controller.started, timeout=5000):
        controller.run_action("summarize")
    gate.set()
    qtbot.waitUntil(lambda: controller.popup.finished, timeout=10000)
    assert controller.popup.status.text() == "Error"
    assert controller.popup.answer_text() == ("The model could not be loaded: "
                                              "Qwen2.5-3B-Instruct: config.json not found")
    assert not controller.popup.replace_button.isEnabled()
    host.shutdown()


def test_stop_while_waiting_means_nothing_runs_after_the_load(qtbot, clipboard, gate):
    host = _loading_host(qtbot, FakeOpener(gate))
    controller, _ = _controller(host, clipboard)
    with qtbot.waitSignal(controller.started, timeout=5000):
        controller.run_action("summarize")
    controller.popup.stop_button.click()
    assert controller.popup.status.text() == "Stopped" and not controller.popup.stop_button.isEnabled()
    with qtbot.waitSignal(host.loaded, timeout=10000):
        gate.set()
    qtbot.wait(100)
    assert host.backend.requests == []
    host.shutdown()


def test_a_model_unloaded_instead_ends_the_wait(qtbot, clipboard, gate):
    host = _loading_host(qtbot, FakeOpener(gate))
    controller, _ = _controller(host, clipboard)
    with qtbot.waitSignal(controller.started, timeout=5000):
        controller.run_action("summarize")
    host.unload()  # e.g. the model is being removed: queued behind the load
    with qtbot.waitSignal(host.unloaded, timeout=10000):
        gate.set()
    assert controller.popup.finished
    assert controller.popup.status.text() == "No model is loaded any more: the action did not run"
    host.shutdown()


def test_without_a_load_in_progress_nothing_is_copied(qtbot, clipboard):
    host = EngineHost(FakeOpener())
    controller, injector = _controller(host, clipboard)
    with qtbot.waitSignal(controller.notify, timeout=1000) as notice:
        controller.run_action("summarize")
    assert notice.args[0].startswith("No model is ready yet")
    assert injector.sent == [] and not controller.popup.isVisible()


def test_a_tray_menu_action_while_loading_waits_too_and_works_on_the_clipboard(qtbot, clipboard, gate):
    host = _loading_host(qtbot, FakeOpener(gate))
    controller, injector = _controller(host, clipboard)
    clipboard.setText("Budget review: Friday at ten.")
    with qtbot.waitSignal(controller.started, timeout=5000) as started:
        controller.run_on_clipboard("summarize")
    assert started.args[0].origin == "clipboard" and injector.sent == []  # the menu took the focus: no copy
    assert controller.popup.status.text().startswith("Loading Qwen2.5-3B-Instruct…")
    with qtbot.waitSignal(controller.answered, timeout=10000):
        gate.set()
    assert host.backend.requests[0][0][-1]["content"].endswith("Budget review: Friday at ten.")
    assert not controller.popup.replace_button.isEnabled()  # not from the selection
    host.shutdown()
