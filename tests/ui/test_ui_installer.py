"""The Linux installer, run for real into a temporary HOME: venv, app, menu entry, autostart,
uninstall. ``--offline`` reuses this machine's packages so the test downloads nothing."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.kernels import unavailable_reason

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "installer" / "install.sh"


def _checkout_copy(dest: Path) -> Path:
    """The tracked files of the working tree (pip builds in-tree: keep the shared checkout clean)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name.decode())
    return dest


def _run(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "QWEN_TRAY_", "PYTHONPATH"))}
    env.update(HOME=str(home), PYTHON=sys.executable)
    return subprocess.run(["bash", str(INSTALLER), *args], env=env, capture_output=True, text=True, timeout=300)


def _desktop(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive in .desktop files
    parser.read(path, encoding="utf-8")
    return parser["Desktop Entry"]


def test_install_into_a_temporary_home_then_uninstall(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git to list the checkout's files")
    home = tmp_path / "home"
    home.mkdir()
    source = _checkout_copy(tmp_path / "src")
    done = _run("--offline", "--source", str(source), "--autostart", home=home)
    assert done.returncode == 0, done.stderr[-3000:]
    reason = unavailable_reason()  # the installer's GPU check says it too (here: no GPU)
    assert (f"warning: Qwen Tray's CUDA kernels cannot run here: {reason}"
            in done.stderr) == (reason is not None)

    venv = home / ".local/share/qwen-tray/venv"
    app_entry = _desktop(home / ".local/share/applications/qwen-tray.desktop")
    assert app_entry["Type"] == "Application" and app_entry["Name"] == "Qwen Tray"
    assert app_entry["Exec"] == f'"{venv}/bin/qwen-tray"'
    assert Path(app_entry["Icon"]).is_file() and Path(app_entry["Icon"]).read_bytes()[:4] == b"\x89PNG"
    autostart = _desktop(home / ".config/autostart/qwen-tray.desktop")
    assert autostart["Exec"] == app_entry["Exec"] and autostart["X-GNOME-Autostart-enabled"] == "true"

    version = subprocess.run([str(venv / "bin/qwen-tray"), "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("qwen-tray "), version.stderr
    probe = subprocess.run(
        [str(venv / "bin/python"), "-c",
         "import app, app.ui.app; from app.paths import resources_dir; print(app.__file__); print(resources_dir())"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-2000:]
    installed_at, resources = probe.stdout.split()
    assert installed_at.startswith(str(venv))  # the installed copy, not the checkout
    assert (Path(resources) / "actions.toml").is_file(), "the wheel must ship app/resources/actions.toml"

    again = _run("--offline", "--source", str(source), home=home)  # re-run without autostart: idempotent
    assert again.returncode == 0, again.stderr[-3000:]
    assert not (home / ".config/autostart/qwen-tray.desktop").exists()

    removed = _run("--uninstall", home=home)
    assert removed.returncode == 0
    assert not venv.exists() and not (home / ".local/share/applications/qwen-tray.desktop").exists()


def test_installer_refuses_unknown_options(tmp_path):
    done = _run("--frobnicate", home=tmp_path)
    assert done.returncode != 0 and "unknown option --frobnicate" in done.stderr
