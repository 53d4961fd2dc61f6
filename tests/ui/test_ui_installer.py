"""The Linux installer, run for real into a temporary HOME: venv, app, menu entry, autostart,
uninstall. ``--offline`` reuses this machine's packages so the test downloads nothing; it builds
the wheel with the setuptools the dev extra installed. Without ``--source`` it installs the
checkout it lives in; a source it cannot install is refused in one sentence before any download
(pip's index is an empty loopback server there, so nothing can come from the network). A fresh Python (a venv from ensurepip:
an old setuptools, no wheel package, no pip cache) gets one sentence saying what it lacks, and
builds once it has what the dev extra declares."""

from __future__ import annotations

import configparser
import http.server
import os
import threading
import tomllib
import venv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.kernels import unavailable_reason

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "installer" / "install.sh"


BUILD_INPUTS = ("pyproject.toml", "README.md", "app", "installer")  # what building the wheel reads, and the installer


def _checkout_copy(dest: Path) -> Path:
    """The files a build reads (pip builds in-tree: keep the shared checkout clean): the tracked
    ones in a git checkout, else (a copy of the source without .git) the build inputs as they are."""
    if (REPO / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(["git", "ls-files", "-z", *BUILD_INPUTS], cwd=REPO, check=True,
                                capture_output=True).stdout.split(b"\0")
        names = [name.decode() for name in listed if name]
    else:
        names = [str(path.relative_to(REPO)) for top in BUILD_INPUTS for path in
                 ([REPO / top] if (REPO / top).is_file() else (REPO / top).rglob("*"))
                 if path.is_file() and "__pycache__" not in path.parts]
    for name in names:
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def _clean_env() -> dict[str, str]:
    """The environment without this checkout on the path and without the test's own folders."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "QWEN_TRAY_", "PYTHONPATH"))}


def _run(*args: str, home: Path, python: str = sys.executable, installer: Path = INSTALLER,
         **env_vars: str) -> subprocess.CompletedProcess:
    env = _clean_env()
    env.update(HOME=str(home), PYTHON=python, PIP_NO_CACHE_DIR="1", **env_vars)
    return subprocess.run(["bash", str(installer), *args], env=env, capture_output=True, text=True, timeout=300)


MARK = "# the installer test's copy of the checkout"


def _desktop(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive in .desktop files
    parser.read(path, encoding="utf-8")
    return parser["Desktop Entry"]


def test_install_into_a_temporary_home_then_uninstall(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    source = _checkout_copy(tmp_path / "src")
    with (source / "app" / "__init__.py").open("a", encoding="utf-8") as init:
        init.write(MARK + "\n")
    # No --source: the checkout the installer lives in (Qwen Tray is not on PyPI).
    done = _run("--offline", "--autostart", home=home, installer=source / "installer" / "install.sh")
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
    # Settings → System reads this file as "on" and would write it line for line the same.
    same = subprocess.run(
        [str(venv / "bin/python"), "-c", "import sys; from app.ui.autostart import XdgAutostart, desktop_entry; "
         "print(XdgAutostart().enabled()); sys.stdout.write(desktop_entry([sys.argv[1]], sys.argv[2]))",
         f"{venv}/bin/qwen-tray", autostart["Icon"]],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**_clean_env(), "HOME": str(home)})
    assert same.returncode == 0, same.stderr[-2000:]
    assert same.stdout == "True\n" + (home / ".config/autostart/qwen-tray.desktop").read_text(encoding="utf-8")

    version = subprocess.run([str(venv / "bin/qwen-tray"), "--version"], capture_output=True, text=True, timeout=120,
                             env=_clean_env())
    assert version.returncode == 0 and version.stdout.startswith("qwen-tray "), version.stderr
    probe = subprocess.run(
        [str(venv / "bin/python"), "-c",
         "import app, app.ui.app; from app.paths import resources_dir; print(app.__file__); print(resources_dir())"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_clean_env())
    assert probe.returncode == 0, probe.stderr[-2000:]
    installed_at, resources = probe.stdout.split()
    assert installed_at.startswith(str(venv))  # the installed copy, not the checkout
    assert MARK in Path(installed_at).read_text(encoding="utf-8")  # from the installer's own checkout
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


class _EmptyIndex(http.server.SimpleHTTPRequestHandler):
    """A package index that has nothing (every project page: 404), as PyPI for ``qwen-tray``."""

    def do_GET(self):  # http.server calls it by this name
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def empty_index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EmptyIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


HINT = "pass --source with a Qwen Tray checkout (the folder with pyproject.toml) or wheel"


@pytest.mark.parametrize("offline", [False, True], ids=["online", "offline"])
def test_a_source_it_cannot_install_is_refused_in_one_sentence_before_any_download(tmp_path, empty_index, offline):
    """Before PyTorch (gigabytes) is fetched; pip's only index is an empty loopback server."""
    not_a_checkout = tmp_path / "not-a-checkout"
    not_a_checkout.mkdir()
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a wheel")
    lone_installer = tmp_path / "downloaded" / "install.sh"  # the script without its checkout
    lone_installer.parent.mkdir()
    shutil.copy2(INSTALLER, lone_installer)
    mode = ["--offline"] if offline else []
    cases = [
        (["--source", str(tmp_path / "missing")], INSTALLER, f"--source {tmp_path / 'missing'} does not exist"),
        (["--source", str(not_a_checkout)], INSTALLER, f"--source {not_a_checkout} is a folder without pyproject.toml"),
        (["--source", str(text_file)], INSTALLER,
         f"--source {text_file} is neither a folder nor a wheel (.whl) or sdist (.tar.gz, .zip)"),
        ([], lone_installer, "--offline cannot download qwen-tray" if offline else
         "pip cannot install qwen-tray (Could not find a version that satisfies the requirement qwen-tray "
         "(from versions: none))"),
    ]
    for args, installer, reason in cases:
        home = tmp_path / f"home-{len(list(tmp_path.glob('home-*')))}"
        home.mkdir()
        done = _run(*mode, "--cpu", *args, home=home, installer=installer, PIP_INDEX_URL=empty_index)
        assert done.returncode == 1, done.stderr[-3000:]
        assert done.stderr.strip().splitlines() == [f"install.sh: error: {reason}: {HINT}"]
        assert not (home / ".local/share/qwen-tray/venv").exists()  # nothing left behind, nothing downloaded


def _dev_build_requirements() -> list[str]:
    """The build tools the dev extra declares (what scripts/test.sh installs before the suite)."""
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return [req for req in dev if req.split(">")[0].split("=")[0].strip() in ("setuptools", "wheel")]


def test_a_fresh_python_is_told_what_it_lacks_then_builds_with_the_dev_extra(tmp_path):
    """A fresh machine's Python (ensurepip's setuptools, no wheel package, nothing cached)."""
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    python = str(fresh / "bin" / "python")
    source = _checkout_copy(tmp_path / "src")
    can_build = subprocess.run(
        [python, "-c", "import importlib.metadata as m, importlib.util as u; v = m.version('setuptools'); "
         "raise SystemExit(0 if tuple(map(int, v.split('.')[:2])) >= (70, 1) or u.find_spec('wheel') else 1)"],
        capture_output=True, timeout=120).returncode == 0
    if not can_build:  # (a newer Python's ensurepip may bring a setuptools that can)
        home = tmp_path / "home-before"
        home.mkdir()
        refused = _run("--offline", "--cpu", "--source", str(source), home=home, python=python)
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"install.sh: error: --offline builds Qwen Tray with {python}, which has setuptools "
            f"{_version(python, 'setuptools')}, which cannot build a wheel without the wheel package: "
            f"run {python} -m pip install 'setuptools>=70.1'"]

    requirements = _dev_build_requirements()
    assert requirements, "the dev extra must bring a setuptools that builds wheels"
    installed = subprocess.run([python, "-m", "pip", "install", "-q", *requirements], capture_output=True,
                               text=True, timeout=300, env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    assert installed.returncode == 0, installed.stderr[-2000:]
    home = tmp_path / "home"
    home.mkdir()
    done = _run("--offline", "--cpu", "--source", str(source), home=home, python=python)
    assert done.returncode == 0, done.stderr[-3000:]
    venv_python = home / ".local/share/qwen-tray/venv/bin/python"
    files = subprocess.run([str(venv_python), "-c", "import importlib.metadata as m; "
                            "print('\\n'.join(str(f) for f in m.files('qwen-tray')))"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_clean_env())
    assert files.returncode == 0, files.stderr[-2000:]
    assert "app/resources/actions.toml" in files.stdout.split()


def _version(python: str, package: str) -> str:
    return subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                          capture_output=True, text=True, timeout=120, check=True).stdout.strip()
