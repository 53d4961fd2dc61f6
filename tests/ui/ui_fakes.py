"""Test doubles for the backend protocol and the key injector.

FakeBackend is a real implementation of the protocol whose "model" answers from a
function of the messages; it can be gated (each token waits for an Event) so tests
control timing without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from app.engine.params import GenerationResult, SamplingParams, Usage
from app.ui.platform.keyinput import KeyInjector


def words(text: str) -> int:
    return len(text.split())


class FakeStream:
    def __init__(self, pieces: list[str], gate: threading.Event | None, prompt_tokens: int):
        self._pieces, self._gate, self._prompt_tokens = pieces, gate, prompt_tokens
        self._cancel = threading.Event()
        self._result: GenerationResult | None = None

    def cancel(self) -> None:
        self._cancel.set()

    def __iter__(self):
        started = time.perf_counter()
        out = []
        for piece in self._pieces:
            if self._gate is not None:
                while not self._gate.wait(0.01):
                    if self._cancel.is_set():
                        break
            if self._cancel.is_set():
                break
            out.append(piece)
            yield piece
        finish = "cancelled" if self._cancel.is_set() else "stop"
        self._result = GenerationResult("".join(out), finish, Usage(self._prompt_tokens, len(out)), (),
                                        0.001, max(time.perf_counter() - started, 1e-6))

    @property
    def result(self) -> GenerationResult:
        assert self._result is not None, "stream not consumed"
        return self._result


class TokenGate:
    """A FakeBackend gate that lets one token through per ``release()``: a slow model whose
    stream the test advances step by step (Event-like ``wait``, as FakeStream calls it)."""

    def __init__(self):
        self._tokens = threading.Semaphore(0)

    def release(self, n: int = 1) -> None:
        self._tokens.release(n)

    def wait(self, timeout: float | None = None) -> bool:
        return self._tokens.acquire(timeout=timeout)


class FakeBackend:
    def __init__(self, name: str = "fake", answer: Callable[[list[dict]], str] | None = None,
                 max_context: int = 4096, count: Callable[[str], int] = words, log: list | None = None,
                 gate: threading.Event | None = None, vram: int | None = None, device: str = "cpu",
                 kernels_unavailable: str | None = None):
        self.name, self.max_context, self.vram = name, max_context, vram
        self.device, self.kernels_unavailable = device, kernels_unavailable
        self._answer = answer or (lambda messages: "Summary: " + " ".join(messages[-1]["content"].split()[-3:]))
        self._count = count
        self.log = log if log is not None else []
        self.gate = gate
        self.requests: list[tuple[list[dict], SamplingParams, int]] = []
        self.closed = False

    def chat(self, messages, params, priority):
        self.requests.append((messages, params, priority))
        text = self._answer(messages)
        pieces = [w + " " for w in text.split(" ")[:-1]] + [text.split(" ")[-1]]
        return FakeStream([p for p in pieces if p], self.gate, self.count_chat_tokens(messages))

    def count_tokens(self, text: str) -> int:
        return self._count(text)

    def vram_bytes(self) -> int | None:
        return self.vram

    def set_idle_unload(self, seconds, on_state) -> None:
        self.idle_unload = seconds  # (a fake holds no model to unload)

    def count_chat_tokens(self, messages) -> int:
        return sum(self._count(m["content"]) + 3 for m in messages)

    def close(self) -> None:
        self.closed = True
        self.log.append(("close", self.name))


class RecordingInjector(KeyInjector):
    """A key injector for offscreen tests, with a simulated target application behind it.

    ``sent`` records "release" and every chord sent ("Ctrl+C", "Ctrl+Shift+V", …). The target
    copies ``selection`` when it gets one of its ``copy_keys`` (after ignoring the first
    ``ignore_copies``); ``keys_held`` answers from ``held`` (the user still pressing the hotkey).
    """

    name = "recording"

    def __init__(self, clipboard, selection: str | None, app_ids: tuple[str, ...] = (),
                 copy_keys: frozenset[str] = frozenset({"Ctrl+C"}), held: list[bool] | None = None,
                 ignore_copies: int = 0):
        self.clipboard, self.selection = clipboard, selection
        self._app_ids, self.copy_keys, self.held = app_ids, copy_keys, list(held or [])
        self.ignore_copies = ignore_copies
        self.sent: list[str] = []
        self.held_polls = 0  # how often keys_held() was asked
        self.focus_restored: list[object] = []

    def keys_held(self) -> bool:
        self.held_polls += 1
        return self.held.pop(0) if self.held else False

    def release_modifiers(self) -> None:
        self.sent.append("release")

    def send_chord(self, chord) -> None:
        self.sent.append(str(chord))
        if str(chord) in self.copy_keys and self.selection is not None:
            if self.ignore_copies:
                self.ignore_copies -= 1
            else:
                self.clipboard.setText(self.selection)

    def remember_focus(self):
        return "target-window"

    def app_ids(self, focus) -> tuple[str, ...]:
        return self._app_ids

    def restore_focus(self, token) -> None:
        self.focus_restored.append(token)


class FakeHotkeys:
    """A hotkey backend that records grabs and refuses the combinations in ``taken`` like an OS would."""

    name = "fake"
    taken: set[str] = set()
    instances: list[FakeHotkeys] = []

    def __init__(self, on_activate):
        self.on_activate = on_activate
        self.registered: dict[str, str] = {}
        self.closed = False
        FakeHotkeys.instances.append(self)

    def register(self, binding_id, hotkey) -> None:
        from app.settings.keys import HotkeyConflictError

        if str(hotkey) in self.taken:
            raise HotkeyConflictError("hotkey {hotkey} is already taken by another program", hotkey=hotkey)
        self.registered[binding_id] = str(hotkey)

    def unregister_all(self) -> None:
        self.registered.clear()

    def close(self) -> None:
        self.closed = True
        self.unregister_all()

    def press(self, binding_id: str) -> None:
        """What the OS does when the user presses the hotkey (from its own thread)."""
        thread = threading.Thread(target=self.on_activate, args=(binding_id,))
        thread.start()
        thread.join()


class FakeOpener:
    """Opens FakeBackends by entry name, logging open/close order; a gate can hold a load."""

    def __init__(self, gate: threading.Event | None = None, fail: set[str] | None = None, **backend_kwargs):
        self.log: list[tuple[str, str]] = []
        self.gate, self.fail = gate, fail or set()
        self.backend_kwargs = backend_kwargs
        self.backends: list[FakeBackend] = []
        self.devices: list[str] = []  # the device each open was asked for

    def __call__(self, entry, progress=None, device="auto", proxy=""):
        from app.errors import ModelLoadError

        self.log.append(("open", entry.name))
        self.devices.append(device)
        for i in range(3):
            if progress is not None:
                progress("loading weights", i, 3)
            if self.gate is not None:
                self.gate.wait(10)
        if entry.name in self.fail:
            raise ModelLoadError(f"{entry.name}: config.json not found")
        backend = FakeBackend(name=entry.name, log=self.log, **self.backend_kwargs)
        self.backends.append(backend)
        return backend


def tray_with_real_local_api():
    """A TrayApp over the fakes (model, hotkeys, key injector) whose Local API is this project's real
    server: what the tests of the Local API's setting and key talk to over loopback."""
    from PySide6.QtGui import QGuiApplication

    from app.server import start_server_in_thread
    from app.ui.app import TrayApp

    return TrayApp(opener=FakeOpener(), hotkey_factory=FakeHotkeys,
                   injector=RecordingInjector(QGuiApplication.clipboard(), "words"),
                   server_finder=lambda: (start_server_in_thread, ""))


def send_and_wait(qtbot, chat, text: str) -> None:
    """Type ``text`` into the chat window, press Send and wait until the answer is in and the
    window is free again (the question and its answer both in the conversation)."""
    chat.input.setPlainText(text)
    n = len(chat.conversation.messages)
    chat.send_button.click()
    qtbot.waitUntil(lambda: len(chat.conversation.messages) == n + 2 and chat.task is None, timeout=5000)
