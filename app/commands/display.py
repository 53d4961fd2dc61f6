"""Before the tray starts on Linux: is there a display, and can Qt's platform plugin open it?

Without one, Qt aborts the process (rc 134) with a message that often blames a library that is
installed. Here the CLI says in one sentence what is missing instead: no ``DISPLAY`` /
``WAYLAND_DISPLAY``; a display that cannot be reached; the libraries Qt's plugin needs, with
the Debian/Ubuntu packages that bring them. The platform plugin is tried in a child process
(``QGuiApplication`` there may abort; this process must not), and only when that fails are the
plugin's libraries looked at (``ldd``) to say which are missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from app.errors import pip_install_extra

# Platforms that need no display server (tests, VNC, framebuffer devices).
HEADLESS_PLATFORMS = ("offscreen", "minimal", "minimalegl", "vnc", "eglfs", "linuxfb", "vkkhrdisplay")
WITHOUT_DISPLAY = "`qwen-tray ask` and `qwen-tray serve` work without one"
# The shared libraries of Qt's xcb / wayland plugins that a minimal Debian or Ubuntu lacks, and
# the packages that bring them (README: the GUI's packages).
DEBIAN_PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0", "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1", "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0", "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0", "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-shape.so.0": "libxcb-shape0", "libxcb-xkb.so.1": "libxcb-xkb1", "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0", "libxcb-sync.so.1": "libxcb-sync1", "libxcb-shm.so.0": "libxcb-shm0",
    "libX11-xcb.so.1": "libx11-xcb1", "libEGL.so.1": "libegl1", "libGL.so.1": "libgl1",
    "libfontconfig.so.1": "libfontconfig1", "libdbus-1.so.3": "libdbus-1-3",
    "libwayland-client.so.0": "libwayland-client0", "libwayland-cursor.so.0": "libwayland-cursor0",
    "libwayland-egl.so.1": "libwayland-egl1",
}
PROBE = "from PySide6.QtGui import QGuiApplication; QGuiApplication(['qwen-tray'])"
PROBE_TIMEOUT_S = 60


def display_problem(env: Mapping[str, str] | None = None, platform: str = sys.platform) -> str | None:
    """Why the tray cannot show itself here (one sentence), or None when it can."""
    env = os.environ if env is None else env
    if platform in ("win32", "darwin"):
        return None
    plugin = _plugin(env)
    if plugin in HEADLESS_PLATFORMS:
        return None
    if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        return ("there is no display to show the tray on (neither DISPLAY nor WAYLAND_DISPLAY is set: start it "
                f"from a desktop session); {WITHOUT_DISPLAY}")
    failure = _probe(env)
    if failure is None:
        return None
    missing = missing_libraries(plugin_library(plugin))
    if missing:
        packages = " ".join(dict.fromkeys(DEBIAN_PACKAGES.get(lib, lib) for lib in missing))
        return (f"Qt's {plugin} platform plugin cannot load: {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} missing (Debian/Ubuntu: sudo apt-get install {packages}); "
                f"{WITHOUT_DISPLAY}")
    return f"{failure}; {WITHOUT_DISPLAY}"


def _plugin(env: Mapping[str, str]) -> str:
    """The platform plugin Qt tries first: QT_QPA_PLATFORM's first entry, else Qt's own choice."""
    chosen = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip()
    if chosen:
        return chosen
    if env.get("WAYLAND_DISPLAY") and env.get("XDG_SESSION_TYPE") == "wayland":
        return "wayland"
    return "xcb"


def _probe(env: Mapping[str, str]) -> str | None:
    """Open the display the way the tray will, in a child process; what went wrong, in words."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], env=dict(env), capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"Qt did not open the display within {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    text = done.stderr
    unreachable = re.search(r"could not connect to display ?(\S*)", text)
    if unreachable:
        display = unreachable.group(1) or env.get("DISPLAY", "")
        return f"the X display {display} cannot be reached (is the desktop session running, and is DISPLAY right?)"
    if "No module named" in text:
        return f"PySide6 does not import: {pip_install_extra('ui')}"
    qt_lines = [line.removeprefix("qt.qpa.plugin: ").strip() for line in text.splitlines()
                if line.startswith(("qt.qpa", "This application failed"))]
    return "Qt cannot start its platform plugin" + (f" ({qt_lines[0]})" if qt_lines else "")


def plugin_library(plugin: str) -> Path | None:
    """PySide6's shared library of ``plugin`` (libqxcb.so, libqwayland.so...), where it ships one."""
    spec = importlib.util.find_spec("PySide6")  # found, not imported: importing Qt is what may fail
    if spec is None or spec.origin is None:
        return None
    name = {"wayland-egl": "wayland"}.get(plugin, plugin)
    path = Path(spec.origin).parent / "Qt" / "plugins" / "platforms" / f"libq{name}.so"
    return path if path.is_file() else None


def missing_libraries(library: Path | None) -> list[str]:
    """The shared libraries ``library`` needs that the dynamic linker cannot find (ldd's view)."""
    if library is None or shutil.which("ldd") is None:
        return []
    try:
        done = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return not_found(done.stdout)


def not_found(ldd_output: str) -> list[str]:
    """The libraries of ``libxcb-cursor.so.0 => not found`` lines of ldd's output, each once, in its
    order (ldd repeats one that the library and one of its own libraries both need)."""
    return list(dict.fromkeys(re.findall(r"^\s*(\S+)\s*=>\s*not found", ldd_output, flags=re.MULTILINE)))
