"""A chat message: the user's own text shown as typed, an answer rendered as Markdown; a code line
wider than the message scrolls sideways and hides no line of the answer."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QVBoxLayout, QWidget
from ui_fakes import FakeOpener

from app.ui.controllers.engine_host import EngineHost
from app.ui.models import ModelEntry
from app.ui.preferences import PreferencesStore
from app.ui.widgets.chat import ChatWindow
from app.ui.widgets.message_view import MessageWidget

# Pasted code and a line of HTML: Markdown would join the lines, drop the underscores and stars
# and take the tag as HTML.
TYPED = ("Why does this fail?\ndef __init__(self, *args, **kwargs):\n    # set up the cache\n"
         "    self.x = a*b*c\n1. first\n<b>tag</b> and 2 < 3 > 1")
LONG_CODE_LINE = ("```python\nresult = compute(" + ", ".join(f"argument_{i}" for i in range(40))
                  + ")\nprint(result)\n```\nDone.")


@pytest.fixture
def host(qtbot):
    host = EngineHost(FakeOpener(answer=lambda m: f"**Answer {len(m)}** to a question"))
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(ModelEntry("fake", path="/fake"))
    yield host
    host.shutdown()


def test_the_users_message_is_shown_as_typed_and_the_answer_as_markdown(qtbot, host):
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.input.setPlainText(TYPED)
    window.send_button.click()
    qtbot.waitUntil(lambda: len(window.conversation.messages) == 2, timeout=5000)

    question, answer = window.message_widgets()
    assert question.view.toPlainText() == TYPED  # its line breaks, spaces, _, * and <b> as typed
    assert question.view.textInteractionFlags() & Qt.TextSelectableByMouse
    question.copy_button.click()
    assert QGuiApplication.clipboard().text() == TYPED
    assert answer.view.toPlainText() == "Answer 1 to a question"  # Markdown rendered: no **


def test_a_message_reopened_from_the_history_is_shown_the_same_way():
    assert MessageWidget("user", TYPED).view.toPlainText() == TYPED
    assert MessageWidget("assistant", "**Paris** `__init__`").view.toPlainText() == "Paris __init__"


def test_a_code_line_wider_than_the_answer_scrolls_sideways_and_hides_no_line(qtbot):
    holder = QWidget()
    layout = QVBoxLayout(holder)
    answer = MessageWidget("assistant", LONG_CODE_LINE)
    layout.addWidget(answer)
    layout.addStretch(1)
    qtbot.addWidget(holder)
    holder.resize(500, 400)
    holder.show()
    view, bar = answer.view, answer.view.horizontalScrollBar()
    qtbot.waitUntil(bar.isVisible, timeout=5000)  # the code block scrolls sideways
    # The bar takes its own room: the viewport holds the whole text ("Done." included), so the
    # view has nothing left to scroll up and down.
    assert view.viewport().height() >= view.document().size().height()
    assert view.verticalScrollBar().maximum() == 0
    with_bar = view.height()

    holder.resize(6000, 400)  # the line fits: no bar, and no room kept for one
    qtbot.waitUntil(lambda: not bar.isVisible(), timeout=5000)
    assert view.height() < with_bar and view.verticalScrollBar().maximum() == 0


def test_an_error_under_an_answer_shows_its_message_as_it_is(qtbot):
    """An error naming a path or a pattern keeps its underscores, stars and angle brackets."""
    message = MessageWidget("assistant")
    qtbot.addWidget(message)
    message.show_error("C:/models/__init__/*.gguf is not <readable>")
    assert message.view.toPlainText() == "Error: C:/models/__init__/*.gguf is not <readable>"
