"""The chat window and the model's context: the answer length capped so the conversation still
goes, whole turns left out with a note that stays, a question too long refused with the text
kept, an answer cut at the answer length marked, and a Send that tokenizes each message once."""

from __future__ import annotations

import pytest
from ui_fakes import FakeOpener, FakeStream, send_and_wait

from app.paths import data_dir
from app.ui.controllers.engine_host import EngineHost
from app.ui.history import ChatHistory
from app.ui.i18n import set_language
from app.ui.models import ModelEntry
from app.ui.preferences import PreferencesStore
from app.ui.widgets.chat import ChatWindow


def _host(qtbot, **backend) -> EngineHost:
    host = EngineHost(FakeOpener(**backend))
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(ModelEntry("fake", path="/fake"))
    return host


@pytest.fixture
def make_window(qtbot):
    hosts = []

    def make(max_tokens: int = 512, **backend) -> ChatWindow:
        hosts.append(_host(qtbot, **backend))
        store = PreferencesStore()
        store.update(max_tokens=max_tokens)
        window = ChatWindow(hosts[-1], store)
        qtbot.addWidget(window)
        return window

    yield make
    for host in hosts:
        host.shutdown()



def test_an_answer_length_as_long_as_the_context_still_sends_the_conversation(qtbot, make_window):
    window = make_window(max_tokens=4096, max_context=4096, answer=lambda m: "Noted.")
    send_and_wait(qtbot, window, "My name is Zed. Reply with just: Noted.")
    send_and_wait(qtbot, window, "What is my name?")
    messages, params, _priority = window.host.backend.requests[-1]
    assert [m["content"] for m in messages] == ["My name is Zed. Reply with just: Noted.", "Noted.", "What is my name?"]
    assert params.max_tokens == 2048  # half the context, as actions get


def test_whole_turns_are_left_out_and_the_note_stays_under_the_answer(qtbot, make_window):
    window = make_window(max_tokens=20, max_context=60, answer=lambda m: "a a a a a")  # counts words
    send_and_wait(qtbot, window, "q " * 20)
    send_and_wait(qtbot, window, "second question here please")
    assert window.scroll.notes() == []  # everything fitted
    send_and_wait(qtbot, window, "third question here please")
    sent = window.host.backend.requests[-1][0]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]  # never an answer without its question
    assert sent[0]["content"] == "second question here please"
    note = "The oldest question and its answer were left out to fit the model's context"
    assert window.scroll.notes() == [note]  # after the answer ended
    assert note not in window.status.text() and "tokens/s" in window.status.text()
    send_and_wait(qtbot, window, "and a fourth question that is a bit longer")
    assert window.scroll.notes() == [note, "The 2 oldest questions and their answers were left out to fit the "
                                           "model's context"]


@pytest.mark.parametrize("language", ["en", "zh_CN"])
def test_a_paste_too_long_for_the_context_is_refused_and_stays_in_the_input_box(qtbot, make_window, language):
    set_language(language)
    window = make_window(max_tokens=20, max_context=100)
    paste = "word " * 200
    window.input.setPlainText(paste)
    window.send_button.click()
    expected = {"en": "This message is too long for the model's context (203 tokens, at most 84 fit): shorten it, "
                      "or select it and run an action such as Summarize, which reads long text in parts",
                "zh_CN": "这条消息超出了模型的上下文长度（203 词元，最多只能容纳 84）：请缩短它，"
                         "或选中这段文字后运行“总结”等操作，它们会把长文分段处理"}[language]
    assert window.status.text() == expected
    assert window.input.toPlainText() == paste and window.send_button.isEnabled()
    assert window.conversation.messages == [] and window.host.backend.requests == []
    assert not (data_dir() / "chats").exists()
    send_and_wait(qtbot, window, "short one")  # the next message goes alone, nothing silently dropped
    assert window.host.backend.requests[-1][0] == [{"role": "user", "content": "short one"}]


class CutStream(FakeStream):
    """Ends as the engine does at the answer length."""

    @property
    def result(self):
        from dataclasses import replace

        return replace(super().result, finish_reason="length")


def test_an_answer_cut_at_the_answer_length_is_marked_and_stays_marked(qtbot, make_window):
    window = make_window()
    backend = window.host.backend
    real_chat = backend.chat
    backend.chat = lambda *args: CutStream(list(real_chat(*args)), None, 3)
    send_and_wait(qtbot, window, "Explain how a car engine works")
    assert window.scroll.notes() == ["Cut off at the answer length"]
    assert window.status.text().startswith("fake · CPU — Cut off at the answer length · ")
    assert window.status.text().endswith(" tokens/s")
    saved, = ChatHistory().load_all()[0]
    assert saved.messages[-1].finish == "length"
    window.new_chat()
    window.open_conversation(saved.id)
    assert window.scroll.notes() == ["Cut off at the answer length"]  # read back from the file


def test_a_send_in_a_long_conversation_tokenizes_each_message_once(qtbot, make_window):
    window = make_window(max_tokens=50, max_context=400, answer=lambda m: "fine")
    backend = window.host.backend
    counted, chat_counts = [], []
    count_tokens, count_chat_tokens = backend.count_tokens, backend.count_chat_tokens
    backend.count_tokens = lambda text: counted.append(text) or count_tokens(text)
    backend.count_chat_tokens = lambda messages: chat_counts.append(len(messages)) or count_chat_tokens(messages)
    history = []
    for i in range(100):
        history += [{"role": "user", "content": f"question {i} " * 10},
                    {"role": "assistant", "content": f"answer {i} " * 10}]
    window.start_conversation(history)
    send_and_wait(qtbot, window, "first")  # (measures what the chat template adds to a message, once)
    for i in range(3):
        chat_counts.clear()
        send_and_wait(qtbot, window, f"next {i}")
        assert chat_counts[0] == 1 and len(chat_counts) <= 3  # the question alone, the request (rarely one more)
    assert len(counted) == len(set(counted))  # no message tokenized twice
