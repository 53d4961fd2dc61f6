"""Preferences, user actions, chat history and hotkey strings: files, validation, recovery."""

from __future__ import annotations

import json

import pytest

from app.paths import data_dir
from app.settings.actions import Action, ActionError, find_action
from app.settings.keys import HotkeyError, normalize_hotkey, parse_hotkey
from app.settings.models import ModelEntry, ModelEntryError
from app.settings.preferences import Preferences, PreferencesError
from app.settings.store import SettingsStore, settings_path
from app.ui.actions import build_messages, load_builtin_actions, new_action_id, target_language_for, with_unique_ids
from app.ui.history import ChatHistory, Conversation
from app.ui.i18n import notice_text
from app.ui.preferences import PreferencesStore


# -- hotkeys ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, canonical", [
    ("ctrl+alt+s", "Ctrl+Alt+S"), ("Alt + Ctrl + space", "Ctrl+Alt+Space"), ("win+shift+f5", "Shift+Super+F5"),
    ("Cmd+Option+t", "Alt+Super+T"),
    ("ctrl+,", "Ctrl+,"), ("", ""),
])
def test_hotkey_strings_normalize(text, canonical):
    assert normalize_hotkey(text) == canonical


@pytest.mark.parametrize("bad, fragment", [
    ("S", "needs Ctrl, Alt or Super"), ("shift+a", "needs Ctrl, Alt or Super"), ("ctrl+alt", "ends with a modifier"),
    ("ctrl+hyper+a", "not a modifier"), ("ctrl+nosuchkey", "unknown key"), ("ctrl++", "empty part"),
    ("ctrl+c", "copy, paste or undo"), ("Ctrl+Shift+V", "copy, paste or undo"), ("cmd+z", "copy, paste or undo"),
    ("ctrl+insert", "copy, paste or undo"), ("ctrl+a", "copy, paste or undo"),
])
def test_bad_hotkeys_are_refused_with_the_reason(bad, fragment):
    with pytest.raises(HotkeyError, match=fragment):
        parse_hotkey(bad)


# -- preferences (the settings file itself: tests/test_settings.py) -------------------------
def test_preferences_round_trip_under_qwen_tray_home(ui_home):
    prefs = Preferences(language="zh_CN", hotkeys={"summarize": "alt+ctrl+q"}, action_modes={"rewrite": "replace"})
    with SettingsStore().edit() as settings:
        settings.preferences = prefs
    assert settings_path().parent == ui_home / "config"
    store = PreferencesStore()
    assert store.prefs == prefs and store.prefs.hotkeys == {"summarize": "Ctrl+Alt+Q"}
    notices = []
    store.on_notice(notices.append)
    assert notices == []


def test_the_tray_keeps_what_the_cli_registered_while_it_ran():
    tray = PreferencesStore()
    local = ModelEntry("tiny", path="/models/tiny")
    with SettingsStore().edit() as settings:  # `qwen-tray models add tiny ...` meanwhile
        settings.add_model(local)
    tray.update(max_tokens=64)
    on_disk = SettingsStore().load()
    assert on_disk.models == [local] and on_disk.default_model == "tiny" and on_disk.preferences.max_tokens == 64
    assert tray.refresh().models == [local]


def test_preferences_validation_names_the_field():
    with pytest.raises(PreferencesError, match="preferences field 'device': must be one of auto, cpu"):
        Preferences(device="gpu")
    with pytest.raises(PreferencesError, match="local_api_port"):
        Preferences(local_api_port=80)
    with pytest.raises(PreferencesError, match="action_modes"):
        Preferences(action_modes={"summarize": "explode"})
    with pytest.raises(PreferencesError, match="unknown preference"):
        PreferencesStore().change(colour="red")
    assert not settings_path().exists()  # a refused change writes nothing


def test_model_entry_validation():
    with pytest.raises(ModelEntryError, match="base_url"):
        ModelEntry("r", kind="remote", base_url="ftp://x", model="m")
    with pytest.raises(ModelEntryError, match="path"):
        ModelEntry("l", kind="local")
    with pytest.raises(ModelEntryError, match=".gguf file"):
        ModelEntry("g", kind="gguf", path="/models/qwen.bin")
    with pytest.raises(ModelEntryError, match="folder name"):
        ModelEntry("../g", kind="gguf", path="/models/qwen.gguf")
    assert ModelEntry("Qwen2.5 3B", kind="gguf", path="/m/q.GGUF").is_local_engine


# -- actions ------------------------------------------------------------------------------
def test_builtin_actions_ship_the_five_with_distinct_hotkeys():
    actions = load_builtin_actions()
    assert [a.id for a in actions] == ["summarize", "translate", "todos", "rewrite", "explain"]
    hotkeys = [normalize_hotkey(a.hotkey) for a in actions if a.hotkey]
    assert hotkeys == ["Ctrl+Alt+S", "Ctrl+Alt+T", "Ctrl+Alt+D", "Ctrl+Alt+R"]
    assert all(a.name_zh for a in actions)
    assert next(a for a in actions if a.id == "todos").prompt.count("- [ ]") == 1


def test_user_actions_round_trip_and_a_clashing_id_is_renamed():
    builtin = load_builtin_actions()
    taken = {a.id for a in builtin}
    mine = Action(id=new_action_id("Make it formal!", taken), name="Make it formal!", prompt="Formal: {text}",
                  hotkey="Ctrl+Alt+F", mode="replace")
    assert mine.id == "user-make-it-formal"
    with SettingsStore().edit() as settings:
        settings.actions = [mine]
    store = SettingsStore()
    assert store.load().actions == [mine] and store.take_notices() == []
    clash = Action(id="summarize", name="Mine", prompt="{text}")
    unique, notices = with_unique_ids([mine, clash, clash], builtin)
    assert [a.id for a in unique] == ["user-make-it-formal", "user-mine", "user-mine-2"]
    assert unique[1] == Action(id="user-mine", name="Mine", prompt="{text}")
    assert [n.args["new_id"] for n in notices] == ["user-mine", "user-mine-2"]
    assert notice_text(notices[0]) == "Your action Mine had the id summarize, which another action already uses; " \
                                      "it is now user-mine"


def test_an_action_is_found_by_its_id_or_its_english_or_chinese_name():
    builtin = load_builtin_actions()
    mine = [Action(id="user-action", name="总结要点", prompt="{text}"),
            Action(id="user-action-2", name="Twice", prompt="{text}"),
            Action(id="user-twice", name="twice", prompt="{text}")]
    actions = [*builtin, *mine]
    assert find_action(actions, "summarize").id == "summarize"
    assert find_action(actions, "Summarize").id == find_action(actions, " 总结 ").id == "summarize"
    assert find_action(actions, "总结要点").id == "user-action"
    with pytest.raises(ActionError, match=r"there is no action '总结要' \(`qwen-tray action --list` shows them\)"):
        find_action(actions, "总结要")  # a name is matched whole
    with pytest.raises(ActionError, match=r"'TWICE' is the name of several actions: use its id \(user-action-2, "):
        find_action(actions, "TWICE")
    with pytest.raises(ActionError, match="there is no action ''"):
        find_action(actions, "")  # not the built-ins without a Chinese name


def test_a_bad_user_action_value_costs_that_value_or_that_action():
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 2, "actions": [
        {"id": "x", "name": "X", "prompt": "no placeholder"},
        {"id": "y", "name": "Y", "prompt": "Y: {text}", "mode": "explode", "hotkey": "Ctrl+Nope"},
        {"id": "z", "name": "Z", "prompt": "Z: {text}"}]}), encoding="utf-8")
    store = SettingsStore()
    actions = store.load().actions
    assert actions == [Action(id="y", name="Y", prompt="Y: {text}"), Action(id="z", name="Z", prompt="Z: {text}")]
    told = [str(n) for n in store.take_notices()]
    assert len(told) == 3 and all(str(path) in n for n in told)
    assert "item #1" in told[0] and "{text}" in told[0] and "left out" in told[0]
    assert "item #2" in told[1] and "mode must be one of popup, replace" in told[1]
    assert "item #2" in told[2] and "unknown key 'Nope'" in told[2]


def test_action_requires_text_placeholder():
    with pytest.raises(ActionError, match=r"\{text\}"):
        Action(id="a", name="A", prompt="Summarize this")


def test_translation_target_defaults_chinese_english_and_follows_the_setting():
    assert target_language_for("今天下午三点开会，请准时参加。", "auto") == "English"
    assert target_language_for("Meeting at three, please be on time.", "auto") == "Simplified Chinese"
    assert target_language_for("今天 meeting 三点", "auto") == "English"  # mostly Chinese letters
    assert target_language_for("Bonjour", "Japanese") == "Japanese"
    translate = next(a for a in load_builtin_actions() if a.id == "translate")
    messages = build_messages(translate, "会议改到周五。{target_language}", "auto")
    assert messages[0]["role"] == "system"
    assert "into English" in messages[1]["content"]
    assert messages[1]["content"].endswith("会议改到周五。{target_language}")  # the user's text is left alone


# -- history ------------------------------------------------------------------------------
def test_chat_history_persists_and_survives_a_broken_file():
    history = ChatHistory()
    first = Conversation()
    first.add("user", "What is a KV cache?\nplease explain")
    first.add("assistant", "It stores keys and values.", tokens_per_second=12.5)
    history.save(first)
    history.save(Conversation())  # empty: not saved
    (data_dir() / "chats" / "broken.json").write_text("{", encoding="utf-8")
    conversations, notices = ChatHistory().load_all()
    assert [c.id for c in conversations] == [first.id]
    assert conversations[0].title == "What is a KV cache?"
    assert conversations[0].messages[1].tokens_per_second == 12.5
    assert conversations[0].as_messages()[0] == {"role": "user", "content": "What is a KV cache?\nplease explain"}
    assert len(notices) == 1
    backups = list((data_dir() / "chats").glob("broken.corrupt-*.json"))
    assert [b.read_text(encoding="utf-8") for b in backups] == ["{"]
    assert str(backups[0]) in notice_text(notices[0])
    assert ChatHistory().load_all()[1] == []  # the backup is not read as a conversation


def test_starter_name_matches_the_converter():
    from app.engine.gguf_import import STARTER_MODEL_NAME
    from app.ui.models import STARTER_NAME

    assert STARTER_NAME == STARTER_MODEL_NAME


def test_new_preferences_are_validated_with_the_field_named():
    prefs = Preferences(chat_send_key="ctrl_enter", copy_shortcuts={" MyTerm ": "ctrl_shift"})
    assert prefs.copy_shortcuts == {"myterm": "ctrl_shift"}  # names are matched lowercased
    with pytest.raises(PreferencesError, match="'chat_send_key'"):
        Preferences(chat_send_key="space")
    with pytest.raises(PreferencesError, match="'copy_shortcuts'.*standard, ctrl_shift, ctrl_insert, none"):
        Preferences(copy_shortcuts={"xterm": "ctrl+c"})
    assert Preferences.salvage(prefs.to_dict())[0] == prefs
