"""The tray's preferences: language, hotkeys, answer settings, the local API, the device, windows,
where models are downloaded from.

Each field declares its default and its check in one line (:func:`pref`): adding a preference
is adding a line. ``Preferences(...)`` is strict (a bad value raises PreferencesError naming the
field, for the Settings dialog); :meth:`Preferences.salvage` reads a file's object leniently:
a bad value falls back to its default (a bad entry of a mapping is left out), each with a
problem for the user, and keys it does not know (a newer version's) are handed back to be
written again unchanged.
"""

from __future__ import annotations

import copy
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from app.errors import QwenTrayError
from app.settings.actions import MODES
from app.settings.keys import COPY_STYLES, HotkeyError, normalize_hotkey

LANGUAGES = ("auto", "en", "zh_CN")
LANGUAGE_ALIASES = {"zh": "zh_CN", "zh-cn": "zh_CN", "zh_cn": "zh_CN"}  # as people type Simplified Chinese
DEVICES = ("auto", "cpu")  # where local models run: the GPU when there is one, or the CPU only
CHAT_SEND_KEYS = ("enter", "ctrl_enter")  # what sends a chat message; the other key makes a new line
MODEL_SOURCES = ("hf", "modelscope")  # where Settings -> Models downloads from (app/hub/sources.py)

# A check returns the value to keep (normalized) and the problems of the entries it left out;
# it raises ValueError (the message says what the value must be) when the value is unusable.
Check = Callable[[Any], tuple[Any, list[str]]]


class PreferencesError(QwenTrayError):
    """A preference has a wrong value (names the field)."""


def language_option(text: str) -> str:
    """--language's value: one of LANGUAGES, or an alias of one (zh, zh-CN: zh_CN); as argparse's
    ``type``, so its ``choices=LANGUAGES`` refuses anything else and its help lists only those."""
    return LANGUAGE_ALIASES.get(text.lower(), text)


def one_of(choices: tuple[str, ...]) -> Check:
    def check(value):
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value, []
    return check


def integer(low: int, high: int) -> Check:
    def check(value):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"must be {low}..{high}")
        return value, []
    return check


def number(low: float, high: float) -> Check:
    def check(value):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g}")
        return value, []
    return check


def boolean(value) -> tuple[bool, list[str]]:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value, []


def text(*, required: bool = False, what: str = "a string") -> Check:
    def check(value):
        if not isinstance(value, str) or (required and not value.strip()):
            raise ValueError(f"must be {what}")
        return value, []
    return check


def url_or_empty(value) -> tuple[str, list[str]]:
    if not isinstance(value, str) or (value.strip() and not value.strip().startswith(("http://", "https://"))):
        raise ValueError("must be empty or a URL starting with http:// or https://")
    return value.strip(), []


def hotkey(value) -> tuple[str, list[str]]:
    if not isinstance(value, str):
        raise ValueError("must be a hotkey such as Ctrl+Alt+S")
    try:
        return normalize_hotkey(value), []
    except HotkeyError as e:
        raise ValueError(str(e)) from None


def mapping(value_check: Check, what: str) -> Check:
    """An object of string keys; an entry whose value fails ``value_check`` is left out (a problem)."""
    def check(value):
        if not isinstance(value, dict):
            raise ValueError(f"must be an object mapping {what}")
        kept, problems = {}, []
        for key, item in value.items():
            try:
                kept[str(key)], _ = value_check(item)
            except ValueError as e:
                problems.append(f"{key!r}: {e}")
        return kept, problems
    return check


def application_styles(value) -> tuple[dict[str, str], list[str]]:
    """Application name -> copy style; names are matched lowercased, so they are stored that way."""
    kept, problems = mapping(one_of(COPY_STYLES), "application names to copy keys")(value)
    named = {name.strip().lower(): style for name, style in kept.items() if name.strip()}
    return named, problems + [f"{name!r}: an empty application name" for name in kept if not name.strip()]


def proxy_url(value) -> tuple[str, list[str]]:
    """"" (the system's proxy), "direct" (none) or an http(s)://host:port proxy."""
    what = "empty (the system's proxy), 'direct' or a proxy URL such as http://proxy.example:3128"
    if not isinstance(value, str):
        raise ValueError(f"must be {what}")
    value = value.strip()
    if value in ("", "direct"):
        return value, []
    url = urllib.parse.urlsplit(value)
    try:
        url.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError(f"must be {what}") from None
    if url.scheme not in ("http", "https") or not url.hostname or url.netloc.endswith(":"):
        raise ValueError(f"must be {what}")
    return value, []


def pref(default: Any, check: Check) -> Any:
    """A preference field: its default and its check."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"check": check})
    return field(default=default, metadata={"check": check})


@dataclass
class Preferences:
    language: str = pref("auto", one_of(LANGUAGES))  # "auto" follows the system locale
    # binding id -> "Ctrl+Alt+S" ("" = off); overrides of the actions' own hotkeys
    hotkeys: dict[str, str] = pref({}, mapping(hotkey, "action ids to hotkeys"))
    action_modes: dict[str, str] = pref({}, mapping(one_of(MODES), "action ids to popup or replace"))
    # "auto": Chinese -> English, anything else -> Simplified Chinese
    translate_target: str = pref("auto", text(required=True, what="a language name or 'auto'"))
    max_tokens: int = pref(512, integer(16, 8192))  # answer length of actions and chat
    temperature: float = pref(0.3, number(0.0, 2.0))
    active_model: str = pref("", text())  # the tray's last model (a registry name); "" = the default model
    local_api_enabled: bool = pref(False, boolean)
    local_api_port: int = pref(18000, integer(1024, 65535))
    device: str = pref("auto", one_of(DEVICES))  # "cpu" keeps the GPU free (games, other models)
    # minutes without requests after which the model's VRAM and memory are given back (0 = never)
    idle_unload_minutes: int = pref(10, integer(0, 24 * 60))
    # window name -> base64 of saveGeometry()
    geometry: dict[str, str] = pref({}, mapping(text(), "window names to strings"))
    # Enter sends (Shift+Enter: a new line), or Ctrl+Enter sends (Enter: a new line)
    chat_send_key: str = pref("enter", one_of(CHAT_SEND_KEYS))
    # application (lowercased X11 WM_CLASS, Windows window class or program name) -> the keys it
    # copies and pastes with; wins over the built-in terminal table
    copy_shortcuts: dict[str, str] = pref({}, application_styles)
    # remote endpoints: "" the system's proxy (HTTPS_PROXY, ...), "direct" none, or a proxy URL
    network_proxy: str = pref("", proxy_url)
    keep_history: bool = pref(True, boolean)  # chats and action results on disk; False keeps none
    model_source: str = pref("hf", one_of(MODEL_SOURCES))  # Settings -> Models downloads from it
    # a Hugging Face mirror such as https://hf-mirror.com ("": HF_ENDPOINT or the hub itself)
    hf_mirror: str = pref("", url_or_empty)
    # the tray has said once where it is and which hotkeys it listens to (a settings file written
    # by `qwen-tray models add-starter` before the first start does not count as a start)
    welcomed: bool = pref(False, boolean)

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                value, problems = f.metadata["check"](getattr(self, f.name))
            except ValueError as e:
                raise PreferencesError(_problem(f.name, e, getattr(self, f.name))) from None
            if problems:
                raise PreferencesError(f"preferences field {f.name!r}: {problems[0]}")
            setattr(self, f.name, value)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def salvage(cls, data: dict) -> tuple[Preferences, list[str], dict]:
        """(preferences, problems, unknown keys) from a file's object; never raises for a value."""
        values, problems = {}, []
        for f in fields(cls):
            if f.name not in data:
                continue
            try:
                values[f.name], lost = f.metadata["check"](data[f.name])
            except ValueError as e:
                problems.append(f"{_problem(f.name, e, data[f.name])}; using the default {_default(f)!r}")
                continue
            problems += [f"preferences field {f.name!r}: {p}; left out" for p in lost]
        unknown = {k: v for k, v in data.items() if k not in {f.name for f in fields(cls)}}
        return cls(**values), problems, unknown


def _problem(name: str, error: ValueError, value: Any) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"preferences field {name!r}: {error}, not {shown}"


def _default(f) -> Any:
    return f.default_factory() if callable(f.default_factory) else f.default
