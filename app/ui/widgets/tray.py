"""The tray icon and its menu, rebuilt from the app's state every time it opens (Vorta style).

Menu: status line · the actions · Open chat · History · Model ▸ · Local API ▸ · Settings · Open log
folder · Quit.
The icon shows the engine state (loading with progress, ready, busy, error); the menu's first
line and the tooltip name the model, its device (GPU, CPU, remote endpoint) and its state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.progress import GPU_STAGE, KERNELS_STAGE
from app.settings.actions import OPEN_CHAT_ID
from app.ui.backend.base import ChatBackend
from app.ui.i18n import current_language, tr
from app.ui.widgets.icons import state_icon

if TYPE_CHECKING:
    from app.ui.app import TrayApp
    from app.ui.controllers.engine_host import EngineHost


def loading_text(host: EngineHost) -> str:
    """What a load is doing, e.g. "Loading Qwen2.5-3B-Instruct… 40%" (the tray's status line and
    the popup of an action that waits for the model)."""
    stage, done, total = host.progress
    model = host.entry.name if host.entry else ""
    percent = f" {100 * done // total}%" if total else ""
    if stage == GPU_STAGE:  # the kernels from CuPy's cache, the graphs captured: a moment
        return tr("Loading {model}: preparing the GPU…", model=model)
    if stage == KERNELS_STAGE:  # a first run: NVRTC compiles every kernel (app.kernels.builds)
        return tr("Loading {model}: building GPU kernels (first run)…", model=model) + percent
    return tr("Loading {model}…", model=model) + percent


def not_ready_text(host: EngineHost) -> str:
    """Why no model answers: the load's error when it failed (not "error" said twice), else the state."""
    if host.state == "error" and host.error:
        return tr("The model could not be loaded: {message}", message=host.error)
    return tr("No model is ready yet ({state})", state=tr(host.state))


def state_text(app: TrayApp) -> str:
    host = app.host
    if host.state == "loading":
        return loading_text(host)
    if host.state == "unloaded":
        name = host.entry.name if host.entry is not None else ""
        return tr("{model} unloaded to free memory; it loads again when needed", model=name)
    if host.state == "error":
        return tr("Error: {message}", message=host.error)
    if host.state == "ready":
        return ready_text(host.backend, busy=host.busy)
    return tr("No model loaded")


def device_label(device: str) -> str:
    return {"cuda": tr("GPU"), "cpu": tr("CPU"), "remote": tr("remote endpoint")}.get(device, device)


def ready_text(backend: ChatBackend, busy: bool = False) -> str:
    """The status line of a loaded model, e.g. "SmolLM2-135M-Instruct · CPU · ready · 4096 tokens of
    context": the model, where it runs and
    the context it loaded with (on a small card less than asked); a remote endpoint's context is
    the value its entry configures (the server does not report one)."""
    head = f"{backend.name} · {device_label(backend.device)} · " + (tr("busy") if busy else tr("ready"))
    if backend.device == "remote":
        return head + " · " + tr("{tokens} tokens of context as configured", tokens=backend.max_context)
    vram = backend.vram_bytes()
    context = tr("{tokens} tokens of context", tokens=backend.max_context)
    if vram is None:
        return f"{head} · {context}"
    return f"{head} · {context} · " + tr("{gib} GiB of VRAM", gib=f"{vram / 2**30:.2f}")


class TrayIcon(QSystemTrayIcon):
    def __init__(self, app: TrayApp):
        super().__init__()
        self.app = app
        self.menu = QMenu()
        self.menu.aboutToShow.connect(self.rebuild_menu)
        self.setContextMenu(self.menu)
        self.activated.connect(self._activated)
        app.host.stateChanged.connect(self.refresh)
        app.host.loadProgress.connect(lambda *_: self.refresh())
        self.rebuild_menu()
        self.refresh()

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.Trigger:  # left click
            self.app.open_chat()

    def refresh(self) -> None:
        host = self.app.host
        state = "busy" if host.busy else host.state
        stage, done, total = host.progress
        self.setIcon(state_icon(state, done / total if host.state == "loading" and total else None))
        # The status line names the model and its device once it is loaded; before, the title does.
        model = host.entry.name if host.entry and host.backend is None else ""
        title = f"Qwen Tray — {model}" if model else "Qwen Tray"
        self.setToolTip(f"{title}\n{state_text(self.app)}")

    def rebuild_menu(self) -> None:
        fill_app_menu(self.menu, self.app)


def fill_app_menu(menu: QMenu, app: TrayApp) -> None:
    """The app's menu from its state: the tray icon's menu, and without a system tray the chat
    window's Menu button (both rebuild it on aboutToShow)."""
    menu.clear()
    status = menu.addAction(state_text(app))
    status.setEnabled(False)
    menu.addSeparator()
    hotkeys = app.effective_hotkeys()
    for action in app.actions:
        label = action.label(current_language())
        item = menu.addAction(f"{label}\t{hotkeys[action.id]}" if hotkeys.get(action.id) else label)
        item.setEnabled(app.host.backend is not None or app.host.state == "loading")  # (it waits for the load)
        item.triggered.connect(lambda _checked=False, a=action.id: app.run_on_clipboard(a))
    menu.addSeparator()
    chat_keys = hotkeys.get(OPEN_CHAT_ID)
    menu.addAction(f"{tr('Open chat')}\t{chat_keys}" if chat_keys else tr("Open chat")).triggered.connect(app.open_chat)
    menu.addAction(tr("History…")).triggered.connect(app.open_history)
    _model_menu(menu.addMenu(tr("Model")), app)
    _api_menu(menu.addMenu(tr("Local API")), app)
    menu.addSeparator()
    menu.addAction(tr("Settings…")).triggered.connect(app.open_settings)
    menu.addAction(tr("Open log folder")).triggered.connect(app.open_log_folder)
    menu.addAction(tr("Quit")).triggered.connect(app.quit)


def _model_menu(sub: QMenu, app: TrayApp) -> None:
    group = QActionGroup(sub)
    group.setExclusive(True)
    current = app.host.entry.name if app.host.entry else ""
    for entry in app.models():
        item = QAction(entry.name, sub, checkable=True)
        item.setChecked(entry.name == current)
        item.triggered.connect(lambda _checked=False, e=entry: app.switch_model(e))
        group.addAction(item)
        sub.addAction(item)


def _api_menu(sub: QMenu, app: TrayApp) -> None:
    api = app.local_api
    if not api.available:
        sub.setEnabled(False)
        sub.setToolTip(api.unavailable_reason)
        sub.addAction(tr("Unavailable: {reason}", reason=api.unavailable_reason)).setEnabled(False)
        return
    toggle = QAction(tr("Enabled"), sub, checkable=True)
    toggle.setChecked(api.running)
    toggle.setEnabled(app.host.backend is not None and app.host.entry.is_local_engine)
    toggle.toggled.connect(app.set_local_api)
    sub.addAction(toggle)
    not_running = tr("Not running: {reason}", reason=api.last_error) if api.last_error else tr("Not running")
    address = sub.addAction(api.url if api.running else not_running)
    address.setEnabled(False)
