"""The chat window: conversations on the left, streamed Markdown answers, Stop, tokens/s.

Enter sends and Shift+Enter starts a new line (as in chat apps), or with the preference
``chat_send_key = "ctrl_enter"`` Ctrl+Enter sends and Enter starts a new line; Tab moves on to
the buttons and Esc stops an answer. The input has the focus whenever the window opens. A
question is saved when it is sent and again with its answer (history.py); an answer that did not
end by itself (Stop, another chat opened, a model switch, quitting) is saved as far as it got,
marked stopped. What goes to the model is app/ui/chat_session.py's: when a long conversation no
longer fits the context, its oldest turns are left out (the answer says so), and a question too
long for the context is refused before it is sent, its text left in the input box.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QByteArray, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QMenu, QPushButton, QSizePolicy, QSplitter, QToolButton,
                               QVBoxLayout, QWidget)

from app.engine.params import GenerationResult, SamplingParams
from app.engine.request import PRIORITY_NORMAL
from app.settings.jsonfile import SettingsFileError
from app.ui.chat_session import ChatAnswer, ChatRequest, MessageTooLongError, TokenCounts, finish_of, plan_request
from app.ui.controllers.engine_host import EngineHost
from app.ui.controllers.tasks import StreamTask
from app.ui.history import ChatHistory, ChatMessage, Conversation, finish_note
from app.ui.i18n import tr
from app.ui.preferences import PreferencesStore
from app.ui.widgets.chat_input import ChatInput
from app.ui.widgets.chat_list import ConversationList
from app.ui.widgets.chat_view import ConversationView, left_out_note, outcome_text
from app.ui.widgets.icons import app_icon
from app.ui.widgets.message_view import MessageWidget
from app.ui.widgets.tray import device_label, loading_text, not_ready_text

NOT_KEPT = "This conversation is not kept in the history: {error}"
TOO_LONG = ("This message is too long for the model's context ({tokens} tokens, at most {limit} fit): shorten it, "
            "or select it and run an action such as Summarize, which reads long text in parts")


class ChatWindow(QWidget):
    closed = Signal()  # the user closed the window (without a system tray the app quits then)

    def __init__(self, host: EngineHost, store: PreferencesStore, history: ChatHistory | None = None,
                 parent: QWidget | None = None, fill_menu: Callable[[QMenu], None] | None = None):
        """``fill_menu``: where no system tray shows the app's menu, the window carries it behind
        a Menu button; the function fills it each time it opens (the tray's menu builder)."""
        super().__init__(parent)
        self._fill_menu = fill_menu
        self.setWindowTitle(tr("Qwen Tray chat"))
        self.setWindowIcon(app_icon())
        self.host, self.store = host, store
        self.list = ConversationList(history or ChatHistory())
        self.list.itemClicked.connect(lambda item: self.open_conversation(item.data(Qt.UserRole)))
        self.list.removed.connect(self._conversations_deleted)  # in the History window
        self.notices = self.list.notices
        self.conversation = Conversation()
        self.task: StreamTask | None = None
        self._answer: ChatAnswer | None = None  # self.task's job: whether its stream began, its cancel
        # Answers stopped because another conversation was opened, until their task ends:
        # task -> (its conversation, the partial answer saved there)
        self._left: dict[StreamTask, tuple[Conversation, ChatMessage]] = {}
        self._answer_widget: MessageWidget | None = None
        self._answer_note: QLabel | None = None  # the line under the answer being written
        self._left_out = ""  # what that answer's request left out of the conversation ("" nothing)
        self._token_counts: TokenCounts | None = None  # of the backend that answered last
        self._last_outcome = ""  # "12.3 tokens/s" of the last answer, shown beside the model name
        self._not_ready_notice = ""  # a notice given while no model was ready: stale once one is
        self._waiting = False  # the last message waits for the model being loaded
        self._build()
        self.host.stateChanged.connect(self._host_changed)
        self.host.loadProgress.connect(self._load_progress)
        self._update_status()
        geometry = store.prefs.geometry.get("chat")
        if geometry:
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode()))
        else:
            self.resize(820, 600)

    def _build(self) -> None:
        self.new_button = QPushButton(tr("New chat"))
        self.new_button.clicked.connect(self.new_chat)
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        self.menu_button = self._menu_button() if self._fill_menu else None
        header = QHBoxLayout()
        if self.menu_button is not None:
            header.addWidget(self.menu_button)
        header.addWidget(self.new_button, 1)
        left_layout.addLayout(header)
        left_layout.addWidget(self.list, 1)

        self.scroll = ConversationView()
        self.input = ChatInput(lambda: self.store.prefs.chat_send_key)
        self.input.sendRequested.connect(self.send)
        self.send_button = QPushButton(tr("Send"))
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton(tr("Stop"))
        self.stop_button.setToolTip(tr("Stop the answer (Esc)"))
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.setEnabled(False)
        self.status = QLabel(wordWrap=True)
        # A long error wraps instead of widening the window (its width would be the whole line's).
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        row = QHBoxLayout()
        row.addWidget(self.status, 1)
        row.addWidget(self.stop_button)
        row.addWidget(self.send_button)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.scroll, 1)
        right_layout.addWidget(self.input)
        right_layout.addLayout(row)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setSizes([200, 620])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

    def _menu_button(self) -> QToolButton:
        button = QToolButton()
        button.setText(tr("Menu"))
        button.setToolTip(tr("Settings, history, models and Quit (this desktop shows no system tray)"))
        button.setPopupMode(QToolButton.InstantPopup)
        menu = QMenu(button)
        menu.aboutToShow.connect(lambda: self._fill_menu(menu))
        button.setMenu(menu)
        return button

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt)
        """Esc stops the answer being written (or the wait for the model), as the popup's does;
        otherwise it does what it did (nothing, in a window that is no dialog)."""
        if event.key() == Qt.Key_Escape and (self.task is not None or self._waiting):
            self.stop()
            return
        super().keyPressEvent(event)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt)
        super().showEvent(event)
        self.input.update_placeholder()  # the setting may have changed meanwhile
        QTimer.singleShot(0, lambda: self.input.setFocus(Qt.ActiveWindowFocusReason))  # once the window is up

    # -- conversations ---------------------------------------------------------------------------
    def new_chat(self) -> None:
        self._leave_answer()
        self.conversation = Conversation()
        self._show_messages()

    def start_conversation(self, messages: list[dict[str, str]], title: str = "") -> None:
        """A new conversation that starts with ``messages`` (a popup's request and answer), listed as
        ``title`` (by default the first line of its first question)."""
        self._leave_answer()
        self.conversation = Conversation(title=title)
        for m in messages:
            self.conversation.add(m["role"], m["content"])
        self._show_messages()
        self._save()
        self.input.setFocus(Qt.OtherFocusReason)

    def open_conversation(self, conversation_id: str) -> None:
        if self.task is not None and conversation_id == self.conversation.id:
            return  # the one being answered is shown already: let it write on
        self._leave_answer()
        self.conversation = self.list.find(conversation_id) or Conversation()
        self._show_messages()

    def _conversations_deleted(self, gone: set[str]) -> None:
        """Deleted in the History window: the one shown goes too."""
        if self.conversation.id in gone:
            self._leave_answer(keep=False)  # its answer has nowhere to go
            self.new_chat()
        self._left = {t: left for t, left in self._left.items() if left[0].id not in gone}  # not saved back

    def _show_messages(self) -> None:
        self.scroll.show_messages(self.conversation.messages)
        if self._token_counts is not None:
            self._token_counts.keep_only({m.content for m in self.conversation.messages})

    def message_widgets(self) -> list[MessageWidget]:
        return self.scroll.message_widgets()

    # -- sending -------------------------------------------------------------------------------
    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.task is not None or self._waiting:
            return
        loading = self.host.backend is None and self.host.state == "loading"
        if self.host.backend is None and not loading:
            self.status.setText(not_ready_text(self.host))
            return
        request = None
        if not loading:
            request = self._request([*self.conversation.as_messages(), {"role": "user", "content": text}])
            if request is None:
                return  # too long: the status says so, and the text stays in the input box
        self.input.clear()
        self.conversation.add("user", text)
        self.scroll.add_message("user", text)
        self._save()  # kept even if the app quits before the answer is written
        if loading:  # right after login or during a switch: sent when the model is ready
            self._waiting = True
            self._set_running(True)  # (Stop gives the message back to the input box)
            self.status.setText(loading_text(self.host))
            return
        self._start_answer(request)

    def _request(self, messages: list[dict[str, str]]) -> ChatRequest | None:
        """What to send the model for ``messages``; None, with the reason in the status line, when
        the last one is too long for its context."""
        if self._token_counts is None or self._token_counts.backend is not self.host.backend:
            self._token_counts = TokenCounts(self.host.backend)  # another model: another tokenizer
        try:
            return plan_request(messages, self._token_counts, self.store.prefs.max_tokens)
        except MessageTooLongError as e:
            self.status.setText(tr(TOO_LONG, tokens=e.tokens, limit=e.limit))
            return None

    def _host_changed(self) -> None:
        if self._waiting and self.host.backend is not None and self.host.state == "ready":
            self._waiting = False
            request = self._request(self.conversation.as_messages())
            if request is None:
                self._give_back_question(None)
            else:
                self._start_answer(request)
        elif self._waiting and self.host.state != "loading":  # the load failed, or no model any more
            self._give_back_question(not_ready_text(self.host))
        elif self.task is not None:
            self.status.setText(self._writing_text())  # an idle-unloaded model loading again, or back
        elif not self._waiting:
            if self.host.state == "ready" and self._last_outcome == self._not_ready_notice:
                self._last_outcome = ""  # said while no model was ready (its error): over now
            self._update_status()

    def _load_progress(self, *_progress) -> None:
        if (self._waiting or self.task is not None) and self.host.state == "loading":
            self.status.setText(loading_text(self.host))

    def _writing_text(self) -> str:
        if self.host.state == "loading":  # the model was unloaded while idle: it loads again first
            return loading_text(self.host)
        return self._left_out or tr("Writing…")

    def _give_back_question(self, status: str | None) -> None:
        """The question goes back into the input box, unsent: nothing typed is lost. ``status``:
        why (None: the status line has said it)."""
        self._waiting = False
        message = self.conversation.messages.pop()
        if self.conversation.messages:
            self._save()
        else:
            self.list.forget(self.conversation)  # it was saved for this question alone
        self._show_messages()
        self.input.setPlainText(message.content)
        self._set_running(False)
        if status is not None:
            self.status.setText(status)

    def _start_answer(self, request: ChatRequest) -> None:
        """Answer the conversation so far (its last message is the user's) with ``request``."""
        params = SamplingParams(max_tokens=request.max_tokens, temperature=self.store.prefs.temperature)
        answer = ChatAnswer(self.host.backend, request.messages, params, PRIORITY_NORMAL)
        self._answer_widget = self.scroll.add_message("assistant", "")
        self._left_out = left_out_note(request.dropped_turns) if request.dropped_turns else ""
        self._answer_note = self.scroll.add_note(self._left_out)
        task = StreamTask(answer.run, answer.cancel)
        task.delta.connect(lambda d, t=task: self.task is t and self._answer_widget.append(d))
        task.finished.connect(lambda r, t=task: self._task_finished(t, r))
        task.failed.connect(lambda msg, t=task: self._task_failed(t, msg))
        self.task, self._answer = task, answer
        self.status.setText(self._writing_text())
        self._set_running(True)
        self.host.track(task)
        task.start()

    def _task_finished(self, task: StreamTask, result: GenerationResult) -> None:
        if task is self.task:
            self._finished(result)
        elif task in self._left:  # its conversation is no longer shown: only its saved answer is completed
            conversation, message = self._left.pop(task)
            if result.text.strip():
                message.content, message.tokens_per_second = result.text, result.tokens_per_second
                message.finish = finish_of(result)
            self._save(conversation)
            if conversation is self.conversation and self.task is None and not self._waiting:
                self._show_messages()  # opened again meanwhile: show the completed answer

    def _task_failed(self, task: StreamTask, message: str) -> None:
        if task is self.task:
            self._failed(message)
        self._left.pop(task, None)  # a left answer keeps what was saved when it was left

    def _finished(self, result: GenerationResult) -> None:
        finish = finish_of(result)
        if result.text.strip():
            self._answer_widget.finish(result.tokens_per_second)
            self.conversation.add("assistant", result.text, result.tokens_per_second, finish)
            self._save()
        else:  # nothing written (stopped before the first token): nothing to keep or send back
            self.scroll.remove(self._answer_widget)
        self._note_under_answer(finish_note(finish) or ("" if result.text.strip() else tr("The model gave no answer")))
        self._last_outcome = outcome_text(finish, result.tokens_per_second)
        self._end_task()

    def _note_under_answer(self, note: str) -> None:
        """The answer's note: how it ended, and what its request left out (kept after it ends)."""
        text = "\n".join(line for line in (note, self._left_out) if line)
        self._answer_note.setText(text)
        self._answer_note.setVisible(bool(text))

    def _failed(self, message: str) -> None:
        self._answer_widget.show_error(message)
        self._last_outcome = tr("Error")
        self._end_task()

    def _end_task(self) -> None:
        self.task, self._answer = None, None
        self._set_running(False)
        self._update_status()

    def _leave_answer(self, keep: bool = True) -> None:
        """The answer being written stops at once: before another conversation is shown, at quit,
        or on Stop before the model took the request. With ``keep``, what it has so far is saved
        in its own conversation, marked stopped; the tokens still on their way and the speed are
        added when its task ends (_task_finished). The window is free at once: the old task's
        signals never reach the message widgets about to be deleted."""
        if self._waiting:
            self._give_back_question(tr("Stopped"))
        task = self.task
        if task is None:
            return
        written = self._answer_widget.text()
        if keep and written.strip():
            self._left[task] = (self.conversation, self.conversation.add("assistant", written, finish="stopped"))
            self._save()
        elif not written.strip():
            self.scroll.remove(self._answer_widget)
        self._note_under_answer(tr("Stopped"))
        self.task, self._answer, self._answer_widget = None, None, None
        task.cancel()
        self._last_outcome = tr("Stopped")
        self._set_running(False)
        self._update_status()

    def stop(self) -> None:
        if self._waiting:
            self._give_back_question(tr("Stopped"))
        if self.task is None:
            return
        if self._answer.streaming:
            self.task.cancel()  # the stream ends at its next token and reports, as stopped, to _finished
        else:
            self._leave_answer()  # the request is being read or the model loads again: nothing to wait for

    def shutdown(self) -> None:
        """At quit, before the engine goes: the answer being written is saved as far as it got,
        marked stopped (its task's last signals would arrive after the event loop has ended). A
        question waiting for the model was saved when it was sent."""
        self._waiting = False
        self._leave_answer()

    def _save(self, conversation: Conversation | None = None) -> None:
        """Save ``conversation`` (the one shown by default) and list it, the latest active first."""
        try:
            self.list.save(self.conversation if conversation is None else conversation)
        except SettingsFileError as e:  # a full disk, a read-only folder: the chat goes on, unsaved
            self.status.setText(tr(NOT_KEPT, error=str(e)))

    def _set_running(self, running: bool) -> None:
        self.send_button.setEnabled(not running)
        self.stop_button.setEnabled(running)

    def show_notice(self, text: str) -> None:
        """What the tray would have said in a balloon (only without a system tray)."""
        self._last_outcome = text
        self._not_ready_notice = text if self.host.state != "ready" else ""
        self._update_status()

    def _update_status(self) -> None:
        if self.task is not None:
            return
        backend = self.host.backend
        if backend is not None and self.host.state == "unloaded":
            self.status.setText(tr("{model} unloaded to free memory; it loads again when needed", model=backend.name))
            return
        model = f"{backend.name} · {device_label(backend.device)}" if backend else tr(self.host.state)
        self.status.setText(f"{model} — {self._last_outcome}" if self._last_outcome else model)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt)
        geometry = bytes(self.saveGeometry().toBase64()).decode()
        self.store.update(geometry={**self.store.prefs.geometry, "chat": geometry})
        super().closeEvent(event)
        self.closed.emit()
