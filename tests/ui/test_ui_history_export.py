"""The History export and reading pane: each entry stands alone (an answer cut inside a code block
gets its closing fence; what the user typed is fenced so that nothing in it can end the fence),
read back with Qt's own Markdown parser; the History window shows what the user typed as typed."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QTextDocument

from app.ui.action_history import ActionHistory, ActionRecord
from app.ui.history import ChatHistory, Conversation
from app.ui.markdown_fences import fenced, with_fences_closed
from app.ui.widgets.history_window import HistoryWindow

# An answer cut at the answer length inside its code block (the review's export2.md).
CUT_ANSWER = "Here it is:\n\n```python\ndef add_numbers(a, b):\n    return a + b\n\nadd"
TYPED = "Why does this fail?\ndef __init__(self, *args, **kwargs):\n    self.x = a*b*c\n1. first\n<b>tag</b> and 2 < 3 > 1"


def _keep_chat(updated: float, *messages: tuple[str, str]) -> Conversation:
    conversation = Conversation()
    for role, content in messages:
        conversation.add(role, content)
    conversation.updated = updated
    ChatHistory().save(conversation)
    return conversation


def _history_window(qtbot) -> HistoryWindow:
    window = HistoryWindow(ChatHistory(), ActionHistory(), open_chat=lambda _id: None, notify=lambda _notice: None)
    qtbot.addWidget(window)
    window.show()  # (reads the history when shown)
    return window


def _read_back(markdown: str) -> list[tuple[str, str]]:
    """Each paragraph of ``markdown`` as Qt's Markdown parser reads it."""
    document = QTextDocument()
    document.setMarkdown(markdown)
    return _paragraphs(document)


def _paragraphs(document: QTextDocument) -> list[tuple[str, str]]:
    """(kind, text) of each paragraph: the kind "h1"/"h2"…, "code" (lines that never wrap) or "text"."""
    blocks, block = [], document.begin()
    while block.isValid():
        level = block.blockFormat().headingLevel()
        kind = f"h{level}" if level else "code" if block.blockFormat().nonBreakableLines() else "text"
        blocks.append((kind, block.text()))
        block = block.next()
    return blocks


def test_an_answer_cut_inside_a_code_block_does_not_swallow_the_entries_after_it(qtbot, tmp_path):
    _keep_chat(2000.0, ("user", "Write an add function"), ("assistant", CUT_ANSWER), ("user", "Thanks"))
    _keep_chat(1000.0, ("user", "What is the capital of France?"), ("assistant", "**Paris**."))
    window = _history_window(qtbot)
    window.export_to(tmp_path / "history.md")

    blocks = _read_back((tmp_path / "history.md").read_text(encoding="utf-8"))
    assert [text for kind, text in blocks if kind == "h2"] == [
        "Chat: Write an add function", "Chat: What is the capital of France?"]
    assert ("code", "    return a + b") in blocks and ("code", "add") in blocks  # the cut code is still code
    assert ("text", "You:") in blocks[blocks.index(("code", "add")):]  # and what follows it is not
    assert blocks[-1] == ("text", "Paris.")  # the last answer: Markdown, not code


def test_answers_that_did_not_end_by_themselves_are_marked_in_the_export_as_in_the_chat(qtbot, tmp_path):
    conversation = Conversation()
    conversation.add("user", "Tell me a story")
    conversation.add("assistant", "Once upon a time", finish="stopped")
    conversation.add("user", "Another one")
    conversation.add("assistant", "There was a king", finish="length")
    conversation.add("user", "Thanks")
    conversation.add("assistant", "You are welcome.")
    ChatHistory().save(conversation)
    window = _history_window(qtbot)
    window.export_to(tmp_path / "history.md")

    texts = [text for kind, text in _read_back((tmp_path / "history.md").read_text(encoding="utf-8")) if kind == "text"]
    assert texts[texts.index("Once upon a time") + 1] == "Stopped"
    assert texts[texts.index("There was a king") + 1] == "Cut off at the answer length"
    assert texts[-1] == "You are welcome."  # an answer that ended by itself gets no note


def test_text_the_user_typed_is_exported_exactly_and_its_fences_cannot_end_the_entry(qtbot, tmp_path):
    typed = "def __init__(self, *args): why?\n```\n````python\nprint(*args)"  # fences of its own, one never closed
    _keep_chat(2000.0, ("user", typed), ("assistant", "It is cut."))
    ActionHistory().save(ActionRecord("Explain", "```\n" + TYPED, "A list.", "m", "explain", created=1000.0))
    window = _history_window(qtbot)
    window.export_to(tmp_path / "history.md")

    blocks = _read_back((tmp_path / "history.md").read_text(encoding="utf-8"))
    code = "\n".join(text for kind, text in blocks if kind == "code")
    assert code == typed + "\n" + "```\n" + TYPED  # every line as typed, in a code block
    assert ("h2", "Chat: def __init__(self, *args): why?") in blocks and ("h2", "Explain") in blocks  # as typed
    assert ("text", "It is cut.") in blocks and blocks[-1] == ("text", "A list.")


def test_the_history_window_shows_what_the_user_typed_as_typed_and_answers_as_markdown(qtbot):
    _keep_chat(2000.0, ("user", TYPED), ("assistant", CUT_ANSWER), ("user", "Thanks"), ("assistant", "**Paris**."))
    ActionHistory().save(ActionRecord("Explain", TYPED, "**Bold** answer", "m", "explain", created=1000.0))
    window = _history_window(qtbot)

    shown = window.view.toPlainText()
    assert TYPED in shown  # line breaks, underscores, stars and the tag, as typed
    assert "def add_numbers(a, b):\n    return a + b\n\nadd\nYou:\nThanks\nAssistant:\nParis." in shown
    paragraphs = _paragraphs(window.view.document())
    typed_lines = TYPED.splitlines()
    assert [kind for kind, text in paragraphs if text in typed_lines] == ["text"] * len(typed_lines)  # wrapping text
    assert ("code", "add") in paragraphs and ("text", "Thanks") in paragraphs
    window.list.setCurrentRow(1)
    assert TYPED in window.view.toPlainText() and "Bold answer" in window.view.toPlainText()
    assert "**Text:**\n\n```text\n" + TYPED + "\n```" in window.view.markdown_text()  # what Export writes


# (message, the line that closes its fence: None where none is open), as CommonMark reads them:
# markdown-it and GitHub's cmark-gfm agree on every one.
FENCES = [
    pytest.param(CUT_ANSWER, "```", id="cut inside a fence"),
    pytest.param("~~~\ncode", "~~~", id="tildes"),
    pytest.param("````markdown\n```python\nx = 1\n```\nmore", "````", id="a shorter fence inside a longer"),
    pytest.param("```\ncode\n````", None, id="closed by a longer fence"),
    pytest.param("~~~\n```\ncode", "~~~", id="backticks do not close tildes"),
    pytest.param("``` `inline` ```\nafter", None, id="a backtick in the info: no fence"),
    pytest.param("1. Install it:\n   ```bash\n   pip install qwen", "   ```", id="in a list item"),
    pytest.param("- ```python\n  print(1)", "  ```", id="on the list item's line"),
    pytest.param("> ```\n> quoted code", "> ```", id="in a block quote"),
    pytest.param("    ```\n    indented code, not a fence", None, id="indented code"),
    pytest.param("Done:\n```python\nx = 1\n```", None, id="closed"),
    pytest.param("```\ncode\n   ```", None, id="closed, indented 3"),
    pytest.param("```\ncode\n    ```", "```", id="indented 4 does not close"),
]


@pytest.mark.parametrize(("message", "closing"), FENCES)
def test_a_message_ending_inside_a_fence_gets_its_closing_fence(qapp, message, closing):
    closed = with_fences_closed(message)
    assert closed == (message if closing is None else f"{message}\n{closing}")
    assert _read_back(f"{closed}\n\n## Next entry\n")[-1] == ("h2", "Next entry")


def test_a_list_item_fence_closed_without_its_indentation_is_a_new_fence():
    """CommonMark (GitHub, markdown-it): the unindented ``` ends the list item, and so its fence,
    and opens a fence of its own (Qt's parser reads that ``` as the closing fence instead)."""
    message = "1. Install it:\n   ```bash\n   pip install qwen\n```\nprint(1)"
    assert with_fences_closed(message) == message + "\n```"


def test_typed_text_is_fenced_longer_than_any_backticks_in_it():
    assert fenced("a ``` b\n`````") == "``````text\na ``` b\n`````\n``````"
    assert fenced("plain") == "```text\nplain\n```"
