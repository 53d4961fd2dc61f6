"""`qwen-tray` without a usable display says in one sentence what is missing (never Qt's abort)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.commands.display import DEBIAN_PACKAGES, missing_libraries, not_found, plugin_library

REPO = Path(__file__).resolve().parents[2]


def _qwen_tray(ui_home: Path, **display: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(QWEN_TRAY_HOME=str(ui_home), **display)
    return subprocess.run([sys.executable, "-m", "app.cli"], env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_no_display_is_said_in_one_line(ui_home):
    done = _qwen_tray(ui_home)
    assert done.returncode == 1  # not Qt's abort (134)
    assert done.stderr == ("qwen-tray: error: there is no display to show the tray on (neither DISPLAY nor "
                           "WAYLAND_DISPLAY is set: start it from a desktop session); `qwen-tray ask` and "
                           "`qwen-tray serve` work without one\n")


def test_a_display_nobody_serves_is_said_in_one_line(ui_home):
    number = next(n for n in range(187, 300) if not Path(f"/tmp/.X11-unix/X{n}").exists())
    done = _qwen_tray(ui_home, DISPLAY=f":{number}")
    assert done.returncode == 1
    assert done.stderr == (f"qwen-tray: error: the X display :{number} cannot be reached (is the desktop session "
                           "running, and is DISPLAY right?); `qwen-tray ask` and `qwen-tray serve` work without one\n")


def test_the_packages_ci_installs_are_all_qt_xcb_needs():
    """.ci/run's apt-get line (also the README's first command) leaves no library of the plugin missing."""
    library = plugin_library("xcb")
    assert library is not None and library.name == "libqxcb.so"
    assert missing_libraries(library) == []
    ci = (REPO / ".ci" / "run").read_text()
    for package in ("libxcb-icccm4", "libxcb-keysyms1", "libxcb-cursor0", "libxkbcommon-x11-0"):
        assert package in ci


def test_missing_libraries_are_named_with_their_debian_packages():
    ldd = ("\tlibQt6XcbQpa.so.6 => /opt/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f8a5361f000)\n"
           "\tlibxcb-cursor.so.0 => not found\n"
           "\tlibxcb-icccm.so.4 => /lib/x86_64-linux-gnu/libxcb-icccm.so.4 (0x00007f8a5352e000)\n"
           "\tlibxkbcommon-x11.so.0 => not found\n")
    missing = not_found(ldd)
    assert missing == ["libxcb-cursor.so.0", "libxkbcommon-x11.so.0"]
    assert [DEBIAN_PACKAGES[lib] for lib in missing] == ["libxcb-cursor0", "libxkbcommon-x11-0"]


def test_a_library_ldd_lists_twice_is_named_once():
    """ldd repeats a library that the plugin and one of its own libraries both need (libqwayland.so)."""
    ldd = ("\tlibQt6WaylandClient.so.6 => /opt/PySide6/Qt/lib/libQt6WaylandClient.so.6 (0x00007f5288a0d000)\n"
           "\tlibwayland-client.so.0 => /lib/x86_64-linux-gnu/libwayland-client.so.0 (0x00007f52889f2000)\n"
           "\tlibwayland-cursor.so.0 => not found\n"
           "\tlibxkbcommon-x11.so.0 => not found\n"
           "\tlibwayland-cursor.so.0 => not found\n")
    assert not_found(ldd) == ["libwayland-cursor.so.0", "libxkbcommon-x11.so.0"]


def _readme_apt_packages() -> set[str]:
    line = next(line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("sudo apt-get install "))
    return set(line.split()[3:])


def test_the_wayland_plugins_missing_libraries_are_named_once_and_readmes_packages_bring_them(ui_home):
    """The wayland plugin on a compositor nobody serves: the CLI names what this machine lacks for it."""
    missing = missing_libraries(plugin_library("wayland"))
    done = _qwen_tray(ui_home, WAYLAND_DISPLAY="qwen-tray-test-nobody", QT_QPA_PLATFORM="wayland")
    assert done.returncode == 1
    if missing:  # a machine without libwayland-cursor0 (this one, CI's)
        packages = " ".join(dict.fromkeys(DEBIAN_PACKAGES[lib] for lib in missing))
        assert done.stderr == (f"qwen-tray: error: Qt's wayland platform plugin cannot load: {', '.join(missing)} "
                               f"{'is' if len(missing) == 1 else 'are'} missing (Debian/Ubuntu: sudo apt-get install "
                               f"{packages}); `qwen-tray ask` and `qwen-tray serve` work without one\n")
        assert set(packages.split()) <= _readme_apt_packages()
    else:
        assert done.stderr.startswith("qwen-tray: error: Qt cannot start its platform plugin")
