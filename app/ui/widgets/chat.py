"""The chat window: conversations on the left, streamed Markdown answers, Stop, tokens/s.

Enter sends and Shift+Enter starts a new line (as in chat apps), or with the preference
``chat_send_key = "ctrl_enter"`` Ctrl+Enter sends and Enter starts a new line. The input
has the focus whenever the window opens. Every conversation is saved after each answer
(history.py). When a long conversation no longer fits the model's context, the oldest
turns are left out of the request (the window says so) rather than failing.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QByteArray, QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QMenu, QPlainTextEdit,
                               QPushButton, QScrollArea, QSizePolicy, QSplitter, QToolButton, QVBoxLayout, QWidget)

from app.engine.params import GenerationResult, SamplingParams
from app.engine.request import PRIORITY_NORMAL
from app.ui.backend.base import ChatBackend
from app.ui.controllers.engine_host import EngineHost
from app.ui.controllers.tasks import StreamTask
from app.settings.jsonfile import SettingsFileError
from app.ui.history import ChatHistory, ChatMessage, Conversation
from app.ui.i18n import tr
from app.ui.preferences import PreferencesStore
from app.ui.widgets.icons import app_icon
from app.ui.widgets.message_view import MessageWidget
from app.ui.widgets.tray import device_label, loading_text, not_ready_text


NOT_KEPT = "This conversation is not kept in the history: {error}"
FOLLOW_SLACK_PX = 8  # this close to the bottom still counts as reading the newest text


def fit_to_context(messages: list[dict[str, str]], backend: ChatBackend, max_tokens: int) -> tuple[list[dict], int]:
    """Drop the oldest turns (never the system message or the last user turn) until the request fits.

    Returns (messages to send, number of messages left out).
    """
    system = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(system):]
    dropped = 0
    while len(rest) > 1 and backend.count_chat_tokens(system + rest) + max_tokens > backend.max_context:
        rest = rest[1:]
        dropped += 1
    return system + rest, dropped


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
        self.history = history or ChatHistory()
        self.conversations, self.notices = self.history.load_all()
        self.history.subscribe(self._history_changed)  # the History window deleted some
        self.conversation = Conversation()
        self.task: StreamTask | None = None
        # Answers stopped because another conversation was opened, until their task ends:
        # task -> (its conversation, the partial answer saved there)
        self._left: dict[StreamTask, tuple[Conversation, ChatMessage]] = {}
        self._answer_widget: MessageWidget | None = None
        self._last_outcome = ""  # "12.3 tokens/s" of the last answer, shown beside the model name
        self._not_ready_notice = ""  # a notice given while no model was ready: stale once one is
        self._waiting = False  # the last message waits for the model being loaded
        self._build()
        self._refresh_list()
        self.host.stateChanged.connect(self._host_changed)
        self.host.loadProgress.connect(lambda *_: self._waiting and self.status.setText(loading_text(self.host)))
        self._update_status()
        geometry = store.prefs.geometry.get("chat")
        if geometry:
            self.restoreGeometry(QByteArray.fromBase64(geometry.encode()))
        else:
            self.resize(820, 600)

    def _build(self) -> None:
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.itemClicked.connect(lambda item: self.open_conversation(item.data(Qt.UserRole)))
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

        self.messages_box = QWidget()
        self.messages_layout = QVBoxLayout(self.messages_box)
        self.messages_layout.addStretch(1)
        self.scroll = QScrollArea(widgetResizable=True)
        self.scroll.setWidget(self.messages_box)
        # The range grows when the layout catches up with a new or growing message (later than
        # the change itself), so the view follows the range, not the change.
        self._follow = True  # at the bottom: keep the newest text in view; off while reading above
        bar = self.scroll.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)
        self.input = QPlainTextEdit()
        self.input.setMaximumHeight(90)
        self.input.setPlaceholderText(self._placeholder())
        self.input.installEventFilter(self)
        self.send_button = QPushButton(tr("Send"))
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton(tr("Stop"))
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

    def _placeholder(self) -> str:
        if self.store.prefs.chat_send_key == "ctrl_enter":
            return tr("Ask anything… (Ctrl+Enter to send, Enter for a new line)")
        return tr("Ask anything… (Enter to send, Shift+Enter for a new line)")

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt)
        if watched is self.input and event.type() == QEvent.KeyPress and isinstance(event, QKeyEvent) \
                and event.key() in (Qt.Key_Return, Qt.Key_Enter):
            mods = event.modifiers() & ~Qt.KeypadModifier
            ctrl_sends = self.store.prefs.chat_send_key == "ctrl_enter"
            if mods == Qt.ControlModifier or (mods == Qt.NoModifier and not ctrl_sends):
                self.send()
                return True
            if mods == Qt.ShiftModifier or mods == Qt.NoModifier:
                self.input.insertPlainText("\n")  # a new paragraph, not Qt's line separator
                return True
        return super().eventFilter(watched, event)

    def showEvent(self, event) -> None:  # noqa: N802 (Qt)
        super().showEvent(event)
        self.input.setPlaceholderText(self._placeholder())  # the setting may have changed meanwhile
        QTimer.singleShot(0, lambda: self.input.setFocus(Qt.ActiveWindowFocusReason))  # once the window is up

    # -- conversations ---------------------------------------------------------------------------
    def _refresh_list(self) -> None:
        self.list.clear()
        for conv in self.conversations:
            item = QListWidgetItem(conv.title or tr("(untitled)"))
            item.setData(Qt.UserRole, conv.id)
            self.list.addItem(item)

    def new_chat(self) -> None:
        self._leave_answer()
        self.conversation = Conversation()
        self._show_messages()

    def start_conversation(self, messages: list[dict[str, str]]) -> None:
        """A new conversation that starts with ``messages`` (a popup's request and answer)."""
        self._leave_answer()
        self.conversation = Conversation()
        for m in messages:
            self.conversation.add(m["role"], m["content"])
        self._show_messages()
        self._save()
        self.input.setFocus(Qt.OtherFocusReason)

    def open_conversation(self, conversation_id: str) -> None:
        if self.task is not None and conversation_id == self.conversation.id:
            return  # the one being answered is shown already: let it write on
        self._leave_answer()
        if not any(c.id == conversation_id for c in self.conversations):
            self.conversations, _notices = self.history.load_all()  # kept since this window opened
            self._refresh_list()
        self.conversation = next((c for c in self.conversations if c.id == conversation_id), Conversation())
        self._show_messages()

    def _history_changed(self) -> None:
        """Conversations deleted elsewhere leave the list; the one shown, too."""
        if not self.history.enabled:
            return  # nothing is written: the list is this window's own
        kept = self.history.ids()
        if self.conversation in self.conversations and self.conversation.id not in kept:
            self._leave_answer(keep=False)  # deleted: its answer has nowhere to go
            self.new_chat()
        self.conversations = [c for c in self.conversations if c.id in kept]
        self._left = {t: left for t, left in self._left.items() if left[0].id in kept}  # not saved back
        self._refresh_list()

    def _show_messages(self) -> None:
        while self.messages_layout.count() > 1:
            widget = self.messages_layout.takeAt(0).widget()
            widget.deleteLater()
        for m in self.conversation.messages:
            if m.role != "system":  # an action's instructions to the model: sent, not shown
                self._add_widget(m.role, m.content, m.tokens_per_second)

    def _add_widget(self, role: str, text: str, tps: float = 0.0) -> MessageWidget:
        widget = MessageWidget(role, text, tps)
        self.messages_layout.insertWidget(self.messages_layout.count() - 1, widget)
        self._follow = True  # a new message is shown, wherever the user had scrolled to
        return widget

    def _scrolled(self, value: int) -> None:
        self._follow = value >= self.scroll.verticalScrollBar().maximum() - FOLLOW_SLACK_PX

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.scroll.verticalScrollBar().setValue(maximum)

    def message_widgets(self) -> list[MessageWidget]:
        return [self.messages_layout.itemAt(i).widget() for i in range(self.messages_layout.count() - 1)]

    # -- sending -------------------------------------------------------------------------------
    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or self.task is not None or self._waiting:
            return
        loading = self.host.backend is None and self.host.state == "loading"
        if self.host.backend is None and not loading:
            self.status.setText(not_ready_text(self.host))
            return
        self.input.clear()
        self.conversation.add("user", text)
        self._add_widget("user", text)
        if loading:  # right after login or during a switch: sent when the model is ready
            self._waiting = True
            self._set_running(True)  # (Stop gives the message back to the input box)
            self.status.setText(loading_text(self.host))
            return
        self._answer()

    def _host_changed(self) -> None:
        if self._waiting and self.host.backend is not None and self.host.state == "ready":
            self._waiting = False
            self._answer()
        elif self._waiting and self.host.state != "loading":  # the load failed, or no model any more
            self._give_back_waiting(not_ready_text(self.host))
        elif not self._waiting:
            if self.host.state == "ready" and self._last_outcome == self._not_ready_notice:
                self._last_outcome = ""  # said while no model was ready (its error): over now
            self._update_status()

    def _give_back_waiting(self, status: str) -> None:
        """The waiting message goes back into the input box, unsent: nothing typed is lost."""
        self._waiting = False
        message = self.conversation.messages.pop()
        self._show_messages()
        self.input.setPlainText(message.content)
        self._set_running(False)
        self.status.setText(status)

    def _answer(self) -> None:
        """Answer the conversation so far (its last message is the user's)."""
        backend = self.host.backend
        prefs = self.store.prefs
        messages, dropped = fit_to_context(self.conversation.as_messages(), backend, prefs.max_tokens)
        params = SamplingParams(max_tokens=prefs.max_tokens, temperature=prefs.temperature)
        self._answer_widget = self._add_widget("assistant", "")
        self.status.setText(tr("{n} older messages left out to fit the context", n=dropped) if dropped
                            else tr("Writing…"))
        holder: dict = {}

        def job(sink):
            stream = backend.chat(messages, params, PRIORITY_NORMAL)
            holder["stream"] = stream
            for delta in stream:
                sink.on_delta(delta)
            return stream.result

        task = StreamTask(job, lambda: holder["stream"].cancel() if "stream" in holder else None)
        task.delta.connect(lambda d, t=task: self.task is t and self._answer_widget.append(d))
        task.finished.connect(lambda r, t=task: self._task_finished(t, r))
        task.failed.connect(lambda msg, t=task: self._task_failed(t, msg))
        self.task = task
        self._set_running(True)
        self.host.track(task)
        task.start()

    def _task_finished(self, task: StreamTask, result: GenerationResult) -> None:
        if task is self.task:
            self._finished(result)
        elif task in self._left:  # its conversation is no longer shown: only its saved answer is completed
            conversation, message = self._left.pop(task)
            message.content, message.tokens_per_second = result.text, result.tokens_per_second
            self._save(conversation)
            if conversation is self.conversation and self.task is None and not self._waiting:
                self._show_messages()  # opened again meanwhile: show the completed answer

    def _task_failed(self, task: StreamTask, message: str) -> None:
        if task is self.task:
            self._failed(message)
        self._left.pop(task, None)  # a left answer keeps what was saved when it was left

    def _finished(self, result: GenerationResult) -> None:
        self._answer_widget.finish(result.tokens_per_second)
        self.conversation.add("assistant", result.text, result.tokens_per_second)
        self._save()
        suffix = f" — {tr('Stopped')}" if result.finish_reason == "cancelled" else ""
        self._last_outcome = tr("{tps:.1f} tokens/s", tps=result.tokens_per_second) + suffix
        self._end_task()

    def _failed(self, message: str) -> None:
        self._answer_widget.show_error(message)
        self._last_outcome = tr("Error")
        self._end_task()

    def _end_task(self) -> None:
        self.task = None
        self._set_running(False)
        self._update_status()

    def _leave_answer(self, keep: bool = True) -> None:
        """Before another conversation is shown: the answer being written stops and, with ``keep``,
        what it has so far is saved in its own conversation, as Stop would; the tokens still on
        their way and the speed are added when its task ends (_task_finished). The window is free
        at once: the old task's signals never reach the message widgets about to be deleted."""
        if self._waiting:
            self._give_back_waiting(tr("Stopped"))
        task = self.task
        if task is None:
            return
        if keep:
            self._left[task] = (self.conversation, self.conversation.add("assistant", self._answer_widget.text()))
            self._save()
        self.task, self._answer_widget = None, None
        task.cancel()
        self._last_outcome = tr("Stopped")
        self._set_running(False)
        self._update_status()

    def stop(self) -> None:
        if self._waiting:
            self._give_back_waiting(tr("Stopped"))
        if self.task is not None:
            self.task.cancel()

    def _save(self, conversation: Conversation | None = None) -> None:
        """Save ``conversation`` (the one shown by default) and list it."""
        conversation = self.conversation if conversation is None else conversation
        try:
            self.history.save(conversation)
        except SettingsFileError as e:  # a full disk, a read-only folder: the chat goes on, unsaved
            self.status.setText(tr(NOT_KEPT, error=str(e)))
        if conversation not in self.conversations:
            self.conversations.insert(0, conversation)
        self._refresh_list()

    def _set_running(self, running: bool) -> None:
        self.send_button.setEnabled(not running)
        self.stop_button.setEnabled(running)

    def show_notice(self, text: str) -> None:
        """What the tray would have said in a balloon (only without a system tray)."""
        self._last_outcome = text
        self._not_ready_notice = text if self.host.state != "ready" else ""
        self._update_status()

    def _update_status(self) -> None:
        if self.task is None:
            backend = self.host.backend
            model = f"{backend.name} · {device_label(backend.device)}" if backend else tr(self.host.state)
            self.status.setText(f"{model} — {self._last_outcome}" if self._last_outcome else model)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt)
        geometry = bytes(self.saveGeometry().toBase64()).decode()
        self.store.update(geometry={**self.store.prefs.geometry, "chat": geometry})
        super().closeEvent(event)
        self.closed.emit()
