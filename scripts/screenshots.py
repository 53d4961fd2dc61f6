"""Screenshots of the tray menu, the answer popup, the chat window and Settings → Hotkeys, for docs/images/.

Runs the real app with a real model under Xvfb (started here when DISPLAY is not set, with
trayer as the system tray):

    python -m scripts.screenshots                       # the starter model (converted on first use)
    python -m scripts.screenshots --model PATH --out docs/images

Needs: xvfb, trayer (apt), PySide6, python-xlib (the popup's text is copied with real keys);
a CJK font (fonts-noto-cjk or fonts-wqy-microhei) for the Chinese shots.
Uses a temporary QWEN_TRAY_HOME unless --home is given, so the user's settings stay untouched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TEXT = ("The quarterly planning meeting has moved from Tuesday to Friday at 3 pm because the "
        "design review ran late. Alice will send the updated slides by Thursday noon, and Bob "
        "needs to confirm the budget numbers with finance before the meeting. The launch date "
        "stays on May 4, but the beta will now open to 500 users instead of 200.")
QUESTIONS = ("What is a KV cache in one paragraph?", "Give me three tips for writing clear emails.")


def start_display() -> list[subprocess.Popen]:
    """Xvfb plus trayer (a system tray), when there is no display yet."""
    if os.environ.get("DISPLAY"):
        return []
    if shutil.which("Xvfb") is None:
        sys.exit("screenshots.py: no DISPLAY and no Xvfb (apt-get install xvfb trayer)")
    read_fd, write_fd = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                            pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        os.environ["DISPLAY"] = f":{f.readline().strip()}"
    children = [xvfb]
    if shutil.which("trayer"):
        children.append(subprocess.Popen(["trayer", "--edge", "top", "--align", "right", "--widthtype", "pixel",
                                          "--width", "120", "--height", "28", "--tint", "0xdddddd",
                                          "--transparent", "true", "--alpha", "0"], stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # let trayer claim the tray selection before the app looks for it
    return children


def wait_until(qapp, predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"screenshots.py: timed out waiting for {what}")
        qapp.processEvents()
        time.sleep(0.02)


def settle(qapp, seconds: float = 0.4) -> None:
    """Let windows map and paint before grabbing them."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        qapp.processEvents()
        time.sleep(0.02)


def shoot_popup(qapp, tray, out: Path, name: str) -> None:
    """A real hotkey action: the text is selected in an editor and copied with real keys (XTest)."""
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QPlainTextEdit

    editor = QPlainTextEdit()
    editor.setWindowTitle("editor")
    editor.setPlainText(TEXT)
    editor.selectAll()
    editor.resize(420, 200)
    editor.move(40, 60)
    editor.show()
    editor.activateWindow()
    editor.setFocus()
    settle(qapp)
    qapp.clipboard().setText("something copied earlier")
    controller = tray.action_controller
    answers: list[str] = []
    controller.answered.connect(answers.append)
    controller.popup.move_near(QPoint(380, 260))
    tray.run_action("summarize")  # what the hotkey runs: copies the selection first
    wait_until(qapp, lambda: bool(answers), 300, "the summary")
    controller.answered.disconnect(answers.append)
    controller.popup.move_near(QPoint(380, 260))
    settle(qapp)
    controller.popup.grab().save(str(out / name))
    controller.popup.hide()
    editor.hide()


def shoot_chat(qapp, tray, out: Path, name: str) -> None:
    tray.open_chat()
    window = tray.chat_window
    window.resize(900, 640)
    window.move(60, 60)
    for question in QUESTIONS:
        n = len(window.conversation.messages)
        window.input.setPlainText(question)
        window.send()
        wait_until(qapp, lambda n=n: len(window.conversation.messages) == n + 2, 600, "a chat answer")
    settle(qapp, 0.8)
    window.grab().save(str(out / name))
    window.hide()


def shoot_menu(qapp, tray, out: Path, name: str) -> None:
    from PySide6.QtCore import QPoint, QRect

    screen = qapp.primaryScreen()
    geometry = tray.tray.geometry() if tray.tray is not None else QRect()
    anchor = geometry.bottomLeft() if geometry.isValid() and not geometry.isEmpty() else \
        QPoint(screen.geometry().width() - 40, 30)
    menu = tray.tray.menu
    menu.aboutToShow.emit()
    size = menu.sizeHint()
    pos = QPoint(min(anchor.x(), screen.geometry().width() - size.width() - 8), anchor.y() + 4)
    menu.popup(pos)
    settle(qapp, 0.8)
    shot = screen.grabWindow(0)
    top_left = QPoint(max(pos.x() - 40, 0), 0)
    region = QRect(top_left, QPoint(screen.geometry().width() - 1, pos.y() + size.height() + 12))
    shot.copy(region).save(str(out / name))
    menu.hide()


def shoot_hotkeys(qapp, tray, out: Path, name: str) -> None:
    tray.open_settings()
    dialog = tray.settings_dialog
    dialog.tabs.setCurrentWidget(dialog.hotkeys_page)
    dialog.resize(720, 560)
    settle(qapp, 0.6)
    dialog.grab().save(str(out / name))
    dialog.reject()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model folder (default: the starter model)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--home", type=Path, help="QWEN_TRAY_HOME to use (default: a temporary one)")
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    children = start_display()
    home = args.home or Path(tempfile.mkdtemp(prefix="qwen-tray-shots-"))
    os.environ["QWEN_TRAY_HOME"] = str(home)
    os.environ["QT_QPA_PLATFORM"] = "xcb"
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        from PySide6.QtWidgets import QApplication

        from app.settings.preferences import Preferences
        from app.settings.store import SettingsStore
        from app.ui.app import TrayApp
        from app.ui.i18n import set_language
        from app.ui.models import ModelEntry

        with SettingsStore().edit() as settings:
            settings.preferences = Preferences(max_tokens=args.max_tokens, temperature=0.0, language="en")
        qapp = QApplication(sys.argv[:1])
        qapp.setQuitOnLastWindowClosed(False)
        tray = TrayApp()
        if args.model:
            tray.host.switch_to(ModelEntry(name=Path(args.model).name, kind="local", path=args.model))
        else:
            tray.start()
        wait_until(qapp, lambda: tray.host.state in ("ready", "error"), 600, "the model")
        if tray.host.state == "error":
            sys.exit(f"screenshots.py: the model did not load: {tray.host.error}")
        shoot_menu(qapp, tray, args.out, "tray-menu.png")
        shoot_popup(qapp, tray, args.out, "popup.png")
        shoot_chat(qapp, tray, args.out, "chat.png")
        shoot_hotkeys(qapp, tray, args.out, "settings-hotkeys.png")
        set_language("zh_CN")
        shoot_menu(qapp, tray, args.out, "tray-menu-zh_CN.png")
        tray.shutdown()
        print("\n".join(str(p) for p in sorted(args.out.glob("*.png"))))
        return 0
    finally:
        for child in reversed(children):
            child.terminate()
            child.wait(10)


if __name__ == "__main__":
    sys.exit(main())
