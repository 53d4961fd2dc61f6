"""installer/install.ps1 and the READMEs' Windows steps, read for what breaks them in Windows
PowerShell 5.1 (the shell Windows 10 and 11 open). PowerShell cannot run here (no package of it
in the registries this project reaches), so these are static checks of known-bad patterns:

- a native command's stderr redirected (``2>$null``, ``2>&1``) where ``$ErrorActionPreference``
  is "Stop": 5.1 turns the first stderr line into a terminating NativeCommandError (fixed only in
  PowerShell 7.1), so a probe of a missing Python stops the installer;
- ``&&`` / ``||``, which exist only from PowerShell 7 on;
- ``"$name:"`` in a string, which 5.1 reads as a drive-qualified variable (a parse error);
- ``python3`` (the Microsoft Store's stand-in on Windows) and an activation the default
  execution policy refuses.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.ui.autostart import APPROVED_FOLDER_KEY, APPROVED_RUN_KEY, RUN_KEY, RUN_VALUE, SHORTCUT_NAME

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "installer" / "install.ps1"
STRING = re.compile(r'"(?:[^"`]|`.)*"|\'[^\']*\'')  # PowerShell's quoting: `" escapes, '' doubles
STDERR_REDIRECT = re.compile(r"(?<![\w$-])2>")
FUNCTION = re.compile(r"^function\s+([\w-]+)")
SCOPES = {"env", "global", "script", "local", "private", "using", "variable", "function"}


def code_of(line: str) -> str:
    """A line without its strings and its comment (a # outside strings starts one)."""
    return STRING.sub('""', line).split("#", 1)[0]


def stderr_redirects_under_stop(text: str) -> list[str]:
    """The lines that redirect a native command's stderr while "Stop" holds: at the top level
    (the script sets Stop), or in a function that has not set "Continue" before that line."""
    found, function, relaxed, depth = [], None, False, 0
    for number, line in enumerate(text.splitlines(), start=1):
        code = code_of(line)
        if depth == 0 and (match := FUNCTION.match(line)):
            function, relaxed = match.group(1), False
        if function and re.search(r'\$ErrorActionPreference\s*=\s*"(Continue|SilentlyContinue)"', line):
            relaxed = True
        if STDERR_REDIRECT.search(code) and not relaxed:
            found.append(f"{number}: {line.strip()}")
        depth += code.count("{") - code.count("}")
        if depth == 0:  # a function's "Continue" ends with it
            function, relaxed = None, False
    return found


def function_body(text: str, name: str) -> str:
    start = text.index(f"function {name}")
    depth, end = 0, start
    for end in range(text.index("{", start), len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            break
    return text[start:end + 1]


@pytest.fixture(scope="module")
def script() -> str:
    return SCRIPT.read_text(encoding="utf-8")


def test_the_check_finds_the_probe_that_stopped_the_installer():
    old = ('$ErrorActionPreference = "Stop"\n'
           'function Find-Python {\n'
           '    foreach ($v in "3.12", "3.11") {\n'
           '        & py "-$v" -c "import sys" 2>$null\n'
           '    }\n'
           '}\n'
           'function Test-Requirement {\n'
           '    $ErrorActionPreference = "Continue"\n'
           '    $output = & pip download x 2>&1\n'
           '}\n'
           '& git status 2>&1\n')
    assert stderr_redirects_under_stop(old) == ['4: & py "-$v" -c "import sys" 2>$null', "11: & git status 2>&1"]


def test_no_native_stderr_is_redirected_while_stop_holds(script):
    assert '$ErrorActionPreference = "Stop"' in script
    assert stderr_redirects_under_stop(script) == []


def test_no_operator_or_variable_that_windows_powershell_5_1_cannot_parse(script):
    lines = script.splitlines()
    chains = [f"{n}: {line}" for n, line in enumerate(lines, 1) if re.search(r"&&|\|\|", code_of(line))]
    assert chains == []
    drive_like = [f"{n}: {line}" for n, line in enumerate(lines, 1)
                  for name in re.findall(r"\$(\w+):", "".join(STRING.findall(line)))
                  if name.lower() not in SCOPES]
    assert drive_like == []


def test_python_is_probed_without_the_store_alias_taken_for_a_wrong_version(script):
    find = function_body(script, "Find-Python")
    assert "Get-PythonVersion" in find and "2>" not in find
    assert "WindowsApps" in find and "Python is not installed" in find  # not "3.10-3.12 is needed"
    assert "winget install Python.Python.3.12" in script and "python.org" in script
    assert '$SupportedPythons = "3.12", "3.11", "3.10"' in script


def test_uninstall_stops_the_tray_then_removes_every_autostart_entry_then_the_folder(script):
    branch = script[script.index("if ($Uninstall) {"):]
    branch = branch[:branch.index("exit 0")]
    order = [branch.index(step) for step in ("Stop-Tray", "Remove-Autostart", "Remove-Item -Recurse -Force $Prefix")]
    assert order == sorted(order)
    assert "catch" in branch and "quit Qwen Tray" in branch  # a file still open is said, not a red trace
    autostart = function_body(script, "Remove-Autostart")
    for removed in ("-Path $RunKey -Name $RunValue", '-Path "$ApprovedKey\\Run" -Name $RunValue',
                    '-Path "$ApprovedKey\\StartupFolder" -Name (Split-Path -Leaf $StartupLink)', "$StartupLink"):
        assert removed in autostart


def test_the_installer_names_the_registry_entries_as_the_app_does(script):
    assert f'$RunKey = "HKCU:\\{RUN_KEY}"' in script
    approved = APPROVED_RUN_KEY.rsplit("\\", 1)[0]
    assert f'$ApprovedKey = "HKCU:\\{approved}"' in script
    assert APPROVED_FOLDER_KEY == approved + "\\StartupFolder"
    assert f'$RunValue = "{RUN_VALUE}"' in script
    assert f'$StartupLink = Join-Path $Startup "{SHORTCUT_NAME}"' in script


def test_the_uninstallers_quit_request_runs(tmp_path):
    """The Python line Stop-Tray hands the venv's python: it imports, and with no tray running
    it returns at once (exit 0); a running tray quits on it as on `qwen-tray --replace`."""
    line = next(line for line in SCRIPT.read_text(encoding="utf-8").splitlines() if "'command': 'quit'" in line)
    code = re.search(r'-c "([^"]+)"', line).group(1)
    env = {**os.environ, "QWEN_TRAY_HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


WINDOWS_BLOCK = re.compile(r"```powershell\n(.*?)```", re.DOTALL)


@pytest.mark.parametrize("page", ["README.md", "README.zh-CN.md"])
def test_the_readmes_windows_steps_run_in_windows_powershell_5_1(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    blocks = WINDOWS_BLOCK.findall(text)
    assert len(blocks) == 2, "the manual steps and the installer line"
    steps, installer = blocks
    for block in blocks:
        assert not re.search(r"&&|\|\||\bpython3\b|/bin/|^\. ", block, re.MULTILINE), block
    lines = steps.splitlines()
    assert lines.index("Set-ExecutionPolicy -Scope Process Bypass -Force") < lines.index(".venv\\Scripts\\Activate.ps1")
    assert any(line.startswith("py -3.12 -m venv") for line in lines)
    assert installer.strip() == "powershell -ExecutionPolicy Bypass -File installer\\install.ps1"
