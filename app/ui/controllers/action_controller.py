"""A hotkey action from keypress to answer: copy the selection, run the action, show/replace.

1. ``run_action(action_id)`` copies the selection (selection_capture.py: waits for the
   hotkey's keys to come up, sends the focused app's copy keys, waits for the clipboard to
   really change, puts the user's clipboard back). Text that did not come from the selection
   is said to come from where it did, and cannot be "replaced".
2. The action (long text is chunked) runs on a worker thread at interactive priority and
   streams into the popup; a free-form instruction from the popup runs on the same text.
   Pressed while a model loads (right after login, or during a switch), the selection is
   copied at once and the popup waits for the load, saying how far it is.
3. Copy / Replace selection (paste back, clipboard restored again) / Undo / Retry / Stop /
   Continue in chat; "replace" actions paste as soon as the answer is complete.
4. A complete answer is handed on (``completed``) to be kept in the history.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QMimeData, QObject, Signal
from PySide6.QtGui import QClipboard

from app.engine.params import GenerationResult, SamplingParams
from app.engine.request import PRIORITY_INTERACTIVE
from app.ui.action_history import ActionRecord
from app.ui.actions import Action, build_messages
from app.ui.controllers.engine_host import EngineHost
from app.ui.controllers.tasks import StreamTask
from app.ui.i18n import current_language, tr
from app.ui.pipeline import ActionPipeline
from app.ui.platform.clipboard import PasteOperation
from app.ui.platform.keyinput import KeyInjector
from app.ui.platform.selection_capture import CapturedText, SelectionCapture
from app.ui.platform.shortcuts import is_terminal_style
from app.settings.preferences import Preferences
from app.ui.widgets.popup import ResultPopup
from app.ui.widgets.tray import loading_text, not_ready_text

INSTRUCTION_ID = "instruction"  # the ad-hoc action of the popup's instruction box


def instruction_action(instruction: str) -> Action:
    """A one-off action: the user's own words about the text."""
    return Action(id=INSTRUCTION_ID, name=instruction, prompt=f"{instruction}\n\n{{text}}", long_text="chunks")


def source_line(captured: CapturedText) -> str:
    """Where the text came from, with its first words, as the popup shows it."""
    words = captured.preview()
    if captured.origin == "selection":
        return tr("Selected text: {words}", words=words)
    if captured.origin == "primary":
        return tr("From the primary selection ({keys} copied nothing): {words}", keys=captured.copy_keys, words=words)
    if captured.origin == "clipboard" and captured.copy_keys:
        return tr("From the clipboard ({keys} copied nothing from the selection): {words}",
                  keys=captured.copy_keys, words=words)
    if captured.origin == "clipboard":
        return tr("From the clipboard: {words}", words=words)
    return tr("Given text: {words}", words=words)


def nothing_to_do(captured: CapturedText) -> str:
    """Why an action has no text to run on (never "nothing is selected": we cannot know that)."""
    if captured.origin == "selection":
        return tr("The selection was copied but holds no text")
    if captured.origin == "given":
        return tr("The text to work on is empty")
    if captured.copy_keys:
        return tr("Nothing was copied from the selection ({keys}), and the clipboard holds no text",
                  keys=captured.copy_keys)
    return tr("The selection cannot be copied here, and the clipboard holds no text")


class ActionController(QObject):
    notify = Signal(str)  # a one-line message for the tray
    answered = Signal(str)  # final answer text (tests and the e2e driver watch it)
    started = Signal(object)  # the CapturedText an action runs on
    continueInChat = Signal(list, str)  # chat messages (the request and its answer, to carry on with), a title
    completed = Signal(object)  # an ActionRecord: an answer to keep in the history

    def __init__(self, host: EngineHost, prefs: Callable[[], Preferences], injector: KeyInjector,
                 clipboard: QClipboard, actions: Callable[[], list[Action]], parent: QObject | None = None):
        super().__init__(parent)
        self._host, self._prefs, self._injector, self._clipboard = host, prefs, injector, clipboard
        self._actions = actions
        self.popup = ResultPopup()
        self._paster = PasteOperation(clipboard, injector, parent=self)
        self._capture = SelectionCapture(clipboard, injector, parent=self)
        self._capture.finished.connect(self._captured_text)
        self._capturing_for: Action | None = None  # the action waiting for the copy in flight
        self._task: StreamTask | None = None
        self._action: Action | None = None
        self._captured: CapturedText | None = None
        self._waiting = False  # the current action waits for the model being loaded
        host.stateChanged.connect(self._host_state_changed)
        host.loadProgress.connect(self._show_loading)
        self.popup.copyRequested.connect(self.copy_answer)
        self.popup.replaceRequested.connect(self.replace_selection)
        self.popup.retryRequested.connect(self.retry)
        self.popup.stopRequested.connect(self.stop)
        self.popup.undoRequested.connect(self.undo)
        self.popup.instructionSubmitted.connect(self.run_instruction)
        self.popup.continueRequested.connect(self.continue_in_chat)
        self.popup.closed.connect(self._popup_closed)

    def mode_of(self, action: Action) -> str:
        return self._prefs().action_modes.get(action.id, action.mode)

    # -- entry points ------------------------------------------------------------------------
    def run_action(self, action_id: str, text: str | None = None) -> None:
        """Run the action ``action_id`` on ``text``, or with None on the selection (copied now)."""
        action = next((a for a in self._actions() if a.id == action_id), None)
        if action is None:
            self.notify.emit(tr("There is no action {name}", name=action_id))
            return
        if self._capture.busy or not self._ready():
            return  # (a copy already in flight: the second press of an impatient user)
        if text is not None:
            self._start(action, CapturedText(text, "given"))
            return
        if self.popup.isActiveWindow() and self._captured is not None:
            # The keyboard is in our popup, not in the window the text came from: a second hotkey
            # works on the same text (copying now would copy the popup).
            self._start(action, self._captured)
            return
        self._capturing_for = action
        self._capture.start(self._prefs().copy_shortcuts)

    def run_on_clipboard(self, action_id: str) -> None:
        """The tray menu: the menu took the focus, so there is no selection to copy; use the clipboard."""
        action = next((a for a in self._actions() if a.id == action_id), None)
        if action is None or self._capture.busy or not self._ready():
            return
        text = self._clipboard.text()
        if not text.strip():
            self.notify.emit(tr("The clipboard holds no text"))
            return
        self._start(action, CapturedText(text, "clipboard"))

    def run_instruction(self, instruction: str) -> None:
        """The popup's instruction box: the user's own instruction on the same text."""
        if self._captured is not None and instruction.strip() and self._ready():
            self._start(instruction_action(instruction.strip()), self._captured)

    def _ready(self) -> bool:
        """A model answers now or once the load in progress ends; else the user is told why not."""
        if self._host.backend is None and not self._model_loading():
            self.notify.emit(not_ready_text(self._host))
            return False
        self.stop()
        self._paster.flush()  # our answer must not be mistaken for the user's clipboard
        return True

    @property
    def capture_timeout_ms(self) -> int:
        """How long one copy may take before it is sent again (tests shorten it)."""
        return self._capture.copy_timeout_ms

    @capture_timeout_ms.setter
    def capture_timeout_ms(self, value: int) -> None:
        self._capture.copy_timeout_ms = value

    def _captured_text(self, captured: CapturedText) -> None:
        action, self._capturing_for = self._capturing_for, None
        if action is not None:
            self._start(action, captured)

    def _start(self, action: Action, captured: CapturedText) -> None:
        if not captured.text.strip():
            self.notify.emit(nothing_to_do(captured))
            return
        self._action, self._captured = action, captured
        self.started.emit(captured)
        self._run()

    def _model_loading(self) -> bool:
        return self._host.backend is None and self._host.state == "loading"

    def _run(self) -> None:
        backend, action, prefs, captured = self._host.backend, self._action, self._prefs(), self._captured
        if backend is None and action is not None and captured is not None and self._model_loading():
            self._wait_for_model(action, captured)
            return
        if backend is None or action is None or captured is None:
            self.notify.emit(not_ready_text(self._host))
            return
        params = SamplingParams(max_tokens=prefs.max_tokens, temperature=prefs.temperature)
        pipeline = ActionPipeline(backend, action, params, PRIORITY_INTERACTIVE, prefs.translate_target)
        text = captured.text
        task = StreamTask(lambda sink: pipeline.run(text, sink), pipeline.cancel)
        # A retried/stopped run may still report after the next one began: only the current one counts.
        task.delta.connect(lambda d, t=task: self._task is t and self.popup.append(d))
        task.progress.connect(lambda _s, done, total, t=task: self._task is t and self.popup.set_step(done, total))
        task.finished.connect(lambda result, t=task: self._task is t and self._finished(result))
        task.failed.connect(lambda message, t=task: self._task is t and self.popup.fail(message))
        self._task = task
        self.popup.begin(action.label(current_language()), source_line(captured), captured.replaceable,
                         self._replace_note(captured))
        self._host.track(task)
        task.start()

    def _wait_for_model(self, action: Action, captured: CapturedText) -> None:
        """The popup opens now, on the text copied now; the answer starts when the model is ready."""
        self._waiting = True
        self.popup.begin(action.label(current_language()), source_line(captured), captured.replaceable,
                         self._replace_note(captured))
        self.popup.wait_for(loading_text(self._host))

    def _host_state_changed(self) -> None:
        host = self._host
        if self._waiting and host.backend is not None and host.state == "ready":
            self._waiting = False
            self._run()
        elif self._waiting and host.state == "error":
            self._waiting = False
            self.popup.fail(tr("The model could not be loaded: {message}", message=host.error))
        elif self._waiting and not self._model_loading():  # unloaded instead (a model removed)
            self._waiting = False
            self.popup.stop_waiting(tr("No model is loaded any more: the action did not run"))
        elif host.state == "ready" and self._task is not None and not self.popup.finished:
            self.popup.wait_for(tr("Thinking…"))  # an idle-unloaded model is back
        else:
            self._show_loading()

    def _show_loading(self, *_progress) -> None:
        """While the answer waits for a load (a first load, or an idle-unloaded model coming back)."""
        answering = self._task is not None and not self.popup.finished
        if self._host.state == "loading" and (self._waiting or answering):
            self.popup.wait_for(loading_text(self._host))

    @staticmethod
    def _replace_note(captured: CapturedText) -> str:
        if captured.origin != "selection":
            return tr("Replace is off: this text did not come from the selection")
        if is_terminal_style(captured.style):
            return tr("Replace is off in a terminal: use Copy")
        return ""

    def _finished(self, result: GenerationResult) -> None:
        self.popup.finish(result)
        self.answered.emit(result.text)
        action, captured, backend = self._action, self._captured, self._host.backend
        if result.finish_reason != "cancelled" and result.text.strip() and action and captured and backend:
            self.completed.emit(ActionRecord(action.label(current_language()), captured.text, result.text,
                                             backend.name, action.id, captured.origin))
        if result.finish_reason != "cancelled" and self._action is not None and self._captured is not None \
                and self._captured.replaceable and self.mode_of(self._action) == "replace" and result.text.strip():
            self.replace_selection()

    # -- popup buttons ----------------------------------------------------------------------
    def copy_answer(self) -> None:
        """The user asked for the answer on the clipboard: this one is not restored."""
        mime = QMimeData()
        mime.setText(self.popup.answer_text())
        self._clipboard.setMimeData(mime)

    def replace_selection(self) -> None:
        answer, captured = self.popup.answer_text(), self._captured
        if answer.strip() and captured is not None and captured.replaceable and self.popup.replace_button.isEnabled():
            self._paster.paste(answer, captured.focus, captured.style)
            self.popup.show_replaced(can_undo=not is_terminal_style(captured.style))

    def undo(self) -> None:
        captured = self._captured
        if captured is not None and self._paster.undo(captured.focus, captured.style):
            self.popup.show_undone()

    def retry(self) -> None:
        if self._action is not None and self._captured is not None:
            self.stop()
            self._run()

    def cancel_wait(self) -> None:
        """Give up an action that waits for the model (an answer already running goes on)."""
        if self._waiting:
            self.stop()

    def stop(self) -> None:
        """Cancel the running answer (it still reports, as stopped, to the popup) or the wait for a load."""
        if self._waiting:
            self._waiting = False
            self.popup.stop_waiting(tr("Stopped"))
        if self._task is not None:
            self._task.cancel()

    def shutdown(self) -> None:
        """At quit: stop, and the user's clipboard back now, not after a paste's settle time (what
        the tray owns at its end is handed on as the user's clipboard: clipboard_keeper.py)."""
        self.stop()
        self._paster.flush()

    def continue_in_chat(self) -> None:
        """The request and its answer become the start of a chat conversation."""
        action, captured, answer = self._action, self._captured, self.popup.answer_text()
        if action is None or captured is None or not answer.strip():
            return
        messages = build_messages(action, captured.text, self._prefs().translate_target)
        self.popup.hide()  # (not close_popup: the keyboard goes to the chat, not back to the target)
        # Titled as History titles an action's result: the first line of the request would be the
        # action's prompt, the same for every conversation continued from that action.
        title = tr("{action}: {preview}", action=action.label(current_language()), preview=captured.preview())
        self.continueInChat.emit([*messages, {"role": "assistant", "content": answer}], title)

    def _popup_closed(self, had_focus: bool) -> None:
        self.stop()
        if had_focus and self._captured is not None:
            self._injector.restore_focus(self._captured.focus)  # the keyboard goes back where it was
