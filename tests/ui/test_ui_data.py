"""Preferences, user actions, chat history and hotkey strings: files, validation, recovery."""

from __future__ import annotations

import json

import pytest

from app.ui.actions import (Action, ActionError, all_actions, build_messages, load_builtin_actions,
                            load_user_actions, new_action_id, save_user_actions, target_language_for)
from app.ui.history import ChatHistory, Conversation
from app.ui.models import ModelEntry, ModelEntryError
from app.ui.paths import config_dir, data_dir
from app.ui.platform.keys import HotkeyError, normalize_hotkey, parse_hotkey
from app.ui.preferences import Preferences, PreferencesError, load_preferences, preferences_path, save_preferences


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
])
def test_bad_hotkeys_are_refused_with_the_reason(bad, fragment):
    with pytest.raises(HotkeyError, match=fragment):
        parse_hotkey(bad)


# -- preferences --------------------------------------------------------------------------
def test_preferences_round_trip_under_qwen_tray_home(ui_home):
    prefs = Preferences(language="zh_CN", hotkeys={"summarize": "alt+ctrl+q"}, action_modes={"rewrite": "replace"},
                        models=[ModelEntry("remote", kind="remote", base_url="http://127.0.0.1:9/v1", model="m")])
    save_preferences(prefs)
    assert preferences_path().parent == ui_home / "config"
    loaded, notice = load_preferences()
    assert notice is None
    assert loaded == prefs
    assert loaded.hotkeys == {"summarize": "Ctrl+Alt+Q"}
    assert loaded.models[0].base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"language": "klingon"}', '{"hotkeys": {"x": "S"}}',
                                     '{"max_tokens": 0}', '{"models": [{"name": "x", "kind": "remote"}]}'])
def test_corrupt_preferences_are_backed_up_and_replaced_by_defaults(content):
    path = preferences_path()
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    prefs, notice = load_preferences()
    assert prefs == Preferences()
    assert notice is not None and "reset to defaults" in notice.text()
    backups = list(path.parent.glob("ui-preferences.corrupt-*.json"))
    assert [b.read_text(encoding="utf-8") for b in backups] == [content]
    assert not path.exists()  # the next save writes fresh defaults; nothing half-valid is kept
    save_preferences(prefs)
    assert load_preferences() == (Preferences(), None)


def test_preferences_validation_names_the_field():
    with pytest.raises(PreferencesError, match="preferences field 'device': must be one of auto, cpu"):
        Preferences(device="gpu")
    with pytest.raises(PreferencesError, match="local_api_port"):
        Preferences(local_api_port=80)
    with pytest.raises(PreferencesError, match="action_modes"):
        Preferences(action_modes={"summarize": "explode"})


def test_unknown_preference_keys_from_a_newer_version_are_ignored():
    path = preferences_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"language": "en", "future_option": 1}), encoding="utf-8")
    prefs, notice = load_preferences()
    assert notice is None and prefs.language == "en"


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


def test_user_actions_round_trip_and_clash_detection():
    builtin = load_builtin_actions()
    taken = {a.id for a in builtin}
    mine = Action(id=new_action_id("Make it formal!", taken), name="Make it formal!", prompt="Formal: {text}",
                  hotkey="Ctrl+Alt+F", mode="replace")
    assert mine.id == "user-make-it-formal"
    save_user_actions([mine])
    loaded, notice = load_user_actions()
    assert notice is None and loaded == [mine]
    assert [a.id for a in all_actions(loaded, builtin)][-1] == mine.id
    clash = Action(id="summarize", name="Mine", prompt="{text}")
    with pytest.raises(ActionError, match="summarize"):
        all_actions([clash], builtin)


def test_broken_user_actions_file_is_moved_aside():
    path = config_dir() / "actions.json"
    path.parent.mkdir(parents=True)
    path.write_text('[{"id": "x", "name": "X", "prompt": "no placeholder"}]', encoding="utf-8")
    actions, notice = load_user_actions()
    assert actions == [] and notice is not None and "{text}" in notice.text()
    assert len(list(path.parent.glob("actions.corrupt-*.json"))) == 1


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
    assert len(notices) == 1 and "broken.corrupt-1.json" in notices[0].text()


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
    assert Preferences.from_dict(prefs.to_dict()) == prefs
