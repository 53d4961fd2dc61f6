"""English and Simplified Chinese UI text: every string has a translation, the locale picks it."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
from PySide6.QtCore import QLocale

import app.settings
import app.ui
from app.settings.notices import Notice
from app.ui.i18n import notice_text, resolve_language, set_language, tr
from app.ui.i18n_zh import ZH_CN

# The tray's text, and the settings' notices it shows (made without Qt, translated when shown).
TEXT_DIRS = (Path(app.ui.__file__).parent, Path(app.settings.__file__).parent)
# tr("...") / Notice("...") / HotkeyError("...") (a NoticeError) with a literal first argument, in single or
# double quotes (adjacent literals joined); and the notice templates kept in constants: NAME = "..." (one or
# more adjacent literals, in parentheses).
LITERAL = re.compile(r"""(?<![A-Za-z_])(?:tr|Notice|HotkeyError|HotkeyConflictError)\(\s*"""
                     r"""((?:"(?:[^"\\]|\\.)*"\s*)+|'(?:[^'\\]|\\.)*')""")
TEMPLATE_CONSTANT = re.compile(r"""^([A-Z_]+) = \(?((?:\s*"(?:[^"\\]|\\.)*")+)\)?$""", re.MULTILINE)
DYNAMIC_KEYS = {"empty", "loading", "ready", "error", "unloaded"}  # tr(state)


def _ui_strings() -> set[str]:
    found = set()
    for path in (p for folder in TEXT_DIRS for p in folder.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for m in LITERAL.finditer(source):
            found.add(_joined(m.group(1)))
        for m in TEMPLATE_CONSTANT.finditer(source):
            if f"Notice({m.group(1)}" in source or f"tr({m.group(1)}" in source:
                found.add("".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))))
    return found


def _joined(literals: str) -> str:
    """The text of adjacent string literals ("a " "b" -> "a b"), quotes and the space between them gone."""
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', literals)) if literals.startswith('"') else literals[1:-1]


def _fields(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def test_every_ui_string_has_a_chinese_translation_with_the_same_placeholders():
    strings = _ui_strings() | DYNAMIC_KEYS
    assert len(strings) > 60  # the scan found the UI text
    missing = sorted(s for s in strings if s not in ZH_CN)
    assert missing == []
    for english in strings:
        assert _fields(ZH_CN[english]) == _fields(english), english
    unused = sorted(set(ZH_CN) - strings)
    assert unused == []


def test_chinese_terms_are_the_same_everywhere():
    """The product is "Qwen Tray" in Chinese too, an action is 操作 (the Settings tab's word) and a
    token 词元, in the UI and in README.zh-CN (which introduces 词元 (token) once)."""
    for english, chinese in ZH_CN.items():
        words = re.sub(r"\{[^}]*\}", "", chinese).lower()  # ({tokens} is a placeholder)
        assert "托盘助手" not in words and "动作" not in words and "token" not in words, english
    readme = (Path(app.ui.__file__).parents[2] / "README.zh-CN.md").read_text(encoding="utf-8")
    assert "托盘助手" not in readme and "动作" not in readme
    prose = re.sub(r"```.*?```|`[^`\n]*`|\([^()\s]*\.json\)", "", readme, flags=re.DOTALL)  # not code, not files
    assert re.findall(r"\btoken", prose) == ["token"] and "词元（token）" in prose


def test_readme_zh_names_the_settings_as_the_chinese_ui_does():
    readme = (Path(app.ui.__file__).parents[2] / "README.zh-CN.md").read_text(encoding="utf-8")
    tabs = {ZH_CN[tab] for tab in ("General", "Hotkeys", "Actions", "Models", "System")}
    paths = [(tab, part) for tab, part in re.findall(r"设置 → (\S+) → ([^*）”。，；\s]+)", readme) if tab in tabs]
    assert paths and [p for p in paths if p[1] not in ZH_CN.values()] == []  # e.g. 我的模型, not 你的模型


def test_tr_translates_and_formats():
    set_language("zh_CN")
    assert tr("Open chat") == "打开对话"
    assert tr("{tps:.1f} tokens/s", tps=12.345) == "12.3 词元/秒"
    assert notice_text(Notice("Local API running at {url}", {"url": "http://127.0.0.1:18000"})) == \
        "本地 API 已在 http://127.0.0.1:18000 运行"
    set_language("en")
    assert tr("{tps:.1f} tokens/s", tps=12.345) == "12.3 tokens/s"


@pytest.mark.parametrize("locale, expected", [("zh_CN", "zh_CN"), ("zh_TW", "zh_CN"), ("en_US", "en"), ("de_DE", "en")])
def test_auto_language_follows_the_system_locale(locale, expected):
    previous = QLocale()
    QLocale.setDefault(QLocale(locale))  # what the system locale would give
    try:
        assert resolve_language("auto") == expected
    finally:
        QLocale.setDefault(previous)
    assert resolve_language("zh_CN") == "zh_CN" and resolve_language("en") == "en"


def test_qt_own_buttons_and_menus_are_in_chinese(qapp):
    from PySide6.QtWidgets import QDialogButtonBox

    from app.ui.i18n import install_qt_translation, qt_translation_file

    assert qt_translation_file("zh_CN") is not None  # shipped in PySide6-Essentials
    set_language("zh_CN")
    try:
        assert install_qt_translation(qapp)
        box = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel | QDialogButtonBox.Apply)
        texts = {box.button(b).text().replace("&", "") for b in (QDialogButtonBox.Ok, QDialogButtonBox.Cancel,
                                                                 QDialogButtonBox.Apply)}
        assert texts == {"确定", "取消", "应用"}
    finally:
        set_language("en")
        install_qt_translation(qapp)  # and back: no translator for English
    box = QDialogButtonBox(QDialogButtonBox.Cancel)
    assert box.button(QDialogButtonBox.Cancel).text().replace("&", "") == "Cancel"


@pytest.mark.parametrize("argv", [["--language", "zh_CN"], ["tray", "--language", "zh_CN"],
                                  ["--language", "zh_CN", "tray"], ["--language", "zh"], ["tray", "--language", "zh-CN"],
                                  ["--language", "zh_cn", "tray"]])
def test_language_option_works_with_and_without_the_tray_command(monkeypatch, argv):
    from app import cli
    from app.ui import launch

    seen = []
    monkeypatch.setattr(launch, "run_tray", lambda tray_argv, instance=None: seen.append(tray_argv) or 0)
    assert cli.main(argv) == 0
    assert seen == [["--language", "zh_CN"]]


def test_the_tray_takes_zh_for_zh_cn_and_refuses_what_it_does_not_know(capsys):
    from app.ui.launch import parse_args

    assert [parse_args(["--language", value]).language for value in ("zh", "ZH-cn", "zh_CN", "en")] == [
        "zh_CN", "zh_CN", "zh_CN", "en"]
    with pytest.raises(SystemExit):
        parse_args(["--language", "fr"])
    assert "invalid choice: 'fr' (choose from 'auto', 'en', 'zh_CN')" in capsys.readouterr().err
