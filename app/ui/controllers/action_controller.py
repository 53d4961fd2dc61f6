"""A hotkey action from keypress to answer: copy the selection, run the action, show/replace.

1. Release held modifiers, remember the clipboard (all formats), send Ctrl+C, wait for the
   clipboard to change (else use the clipboard text as it is), put the clipboard back.
2. Run the action (long text is chunked) on a worker thread at interactive priority and
   stream the answer into the popup.
3. Copy / Replace selection (paste back, clipboard restored again) / Retry / Stop; actions
   in "replace" mode paste as soon as the answer is complete, and the popup offers Undo.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QMimeData, QObject, Signal
from PySide6.QtGui import QClipboard

from app.engine.params import GenerationResult, SamplingParams
from app.engine.request import PRIORITY_INTERACTIVE
from app.ui.actions import Action
from app.ui.controllers.engine_host import EngineHost
from app.ui.controllers.tasks import StreamTask
from app.ui.i18n import current_language, tr
from app.ui.pipeline import ActionPipeline
from app.ui.platform.clipboard import COPY_TIMEOUT_MS, PasteOperation, SelectionCapture
from app.ui.platform.keyinput import KeyInjector
from app.ui.preferences import Preferences
from app.ui.widgets.popup import ResultPopup


class ActionController(QObject):
    notify = Signal(str)  # a one-line message for the tray
    answered = Signal(str)  # final answer text (tests and the e2e driver watch it)

    def __init__(self, host: EngineHost, prefs: Callable[[], Preferences], injector: KeyInjector,
                 clipboard: QClipboard, parent: QObject | None = None):
        super().__init__(parent)
        self._host, self._prefs, self._injector, self._clipboard = host, prefs, injector, clipboard
        self.popup = ResultPopup()
        self._paster = PasteOperation(clipboard, injector, parent=self)
        self._capture: SelectionCapture | None = None
        self._task: StreamTask | None = None
        self._action: Action | None = None
        self._text = ""
        self._focus: object | None = None
        self._can_replace = False  # only a run on a copied selection has something to replace
        self.capture_timeout_ms = COPY_TIMEOUT_MS
        self.popup.copyRequested.connect(self.copy_answer)
        self.popup.replaceRequested.connect(self.replace_selection)
        self.popup.retryRequested.connect(self.retry)
        self.popup.stopRequested.connect(self.stop)
        self.popup.undoRequested.connect(lambda: self._paster.undo(self._focus))

    def mode_of(self, action: Action) -> str:
        return self._prefs().action_modes.get(action.id, action.mode)

    def trigger(self, action: Action, from_hotkey: bool = True) -> None:
        """Start ``action``: on the selection (hotkey) or on the clipboard text (tray menu)."""
        if self._host.backend is None:
            self.notify.emit(tr("No model is ready yet ({state})", state=tr(self._host.state)))
            return
        if self._capture is not None:
            return  # a copy is already in flight
        self.stop()
        self._paster.flush()  # our answer must not be mistaken for the user's clipboard
        if not from_hotkey:
            # The menu took the focus: there is no selection to copy or replace; use the clipboard text.
            self._start(action, self._clipboard.text(), None, can_replace=False)
            return
        capture = SelectionCapture(self._clipboard, self._injector, self.capture_timeout_ms, parent=self)
        capture.finished.connect(lambda text, _from_selection: self._captured(action, capture, text))
        self._capture = capture
        capture.start()

    def _captured(self, action: Action, capture: SelectionCapture, text: str) -> None:
        self._capture = None
        capture.deleteLater()
        self._start(action, text, capture.focus_token, can_replace=True)

    def _start(self, action: Action, text: str, focus: object | None, can_replace: bool) -> None:
        if not text.strip():
            self.notify.emit(tr("Nothing is selected and the clipboard holds no text"))
            return
        self._action, self._text, self._focus = action, text, focus
        self._can_replace = can_replace
        self._run()

    def _run(self) -> None:
        backend, action, prefs = self._host.backend, self._action, self._prefs()
        if backend is None or action is None:
            self.notify.emit(tr("No model is ready yet ({state})", state=tr(self._host.state)))
            return
        params = SamplingParams(max_tokens=prefs.max_tokens, temperature=prefs.temperature)
        pipeline = ActionPipeline(backend, action, params, PRIORITY_INTERACTIVE, prefs.translate_target)
        text = self._text
        task = StreamTask(lambda sink: pipeline.run(text, sink), pipeline.cancel)
        # A retried/stopped run may still report after the next one began: only the current one counts.
        task.delta.connect(lambda d, t=task: self._task is t and self.popup.append(d))
        task.progress.connect(lambda _s, done, total, t=task: self._task is t and self.popup.set_step(done, total))
        task.finished.connect(lambda result, t=task: self._task is t and self._finished(result))
        task.failed.connect(lambda message, t=task: self._task is t and self.popup.fail(message))
        self._task = task
        self.popup.begin(action.label(current_language()), can_replace=self._can_replace)
        self._host.track(task)
        task.start()

    def _finished(self, result: GenerationResult) -> None:
        self.popup.finish(result)
        self.answered.emit(result.text)
        if result.finish_reason != "cancelled" and self._action is not None and self._can_replace \
                and self.mode_of(self._action) == "replace" and result.text.strip():
            self.replace_selection()

    # -- popup buttons ----------------------------------------------------------------------
    def copy_answer(self) -> None:
        """The user asked for the answer on the clipboard: this one is not restored."""
        mime = QMimeData()
        mime.setText(self.popup.answer_text())
        self._clipboard.setMimeData(mime)

    def replace_selection(self) -> None:
        answer = self.popup.answer_text()
        if answer.strip() and self._can_replace:
            self._paster.paste(answer, self._focus)
            self.popup.show_replaced()

    def retry(self) -> None:
        if self._action is not None and self._text:
            self.stop()
            self._run()

    def stop(self) -> None:
        """Cancel the running answer; it still reports (as stopped) to the popup."""
        if self._task is not None:
            self._task.cancel()
