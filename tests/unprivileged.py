"""Run a process the way a user without root runs it: a file without read permission and a
folder without write permission refuse it (EACCES).

The suite runs as root in CI, and root reads and writes everything through two capabilities,
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH. The child drops both, from its bounding set too so
that exec does not give them back; it keeps uid 0, so it still reaches the test's own files
(pytest's temporary folders are root's, mode 0700) through the owner's permission bits. As
another user nothing needs dropping: chmod alone does it.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CLI_BATCH = Path(__file__).with_name("cli_batch.py")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_file_permission_override() -> None:
    """preexec_fn: this process (and what it execs) obeys file permissions like any user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) refused (no CAP_SETPCAP?)")
    header, data = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(args) without the power to ignore file permissions."""
    preexec = _drop_file_permission_override if os.geteuid() == 0 else None
    return subprocess.run(args, check=False, preexec_fn=preexec, capture_output=True, text=True, encoding="utf-8", **kwargs)


def run_cli_commands(home: Path, *commands: list[str], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Each ``qwen-tray`` command (argv list) run in one unprivileged interpreter, in order."""
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONIOENCODING": "utf-8"}
    proc = run([sys.executable, str(CLI_BATCH), json.dumps(list(commands))], env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [subprocess.CompletedProcess(r["argv"], r["code"], r["stdout"], r["stderr"])
            for r in json.loads(proc.stdout)]
