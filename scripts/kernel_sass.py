#!/usr/bin/env python3
"""Compile kernel instances for a GPU architecture without a GPU: registers, spills, SASS.

Uses NVRTC (libnvrtc from pip `nvidia-cuda-nvrtc-cu12`) for the exact source the loader
compiles, then `ptxas -v` (pip `nvidia-cuda-nvcc-cu12`) and optionally `cuobjdump -sass`
(pip `nvidia-cuda-cuobjdump`). A development tool: none of it is needed at run time.

    python -m scripts.kernel_sass gemv.cu "gemv_kernel<4, 2, true, 1, 1>" --arch 86 [--sass] \
        --nvrtc /tmp/nv/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 --ptxas /tmp/nv/nvidia/cuda_nvcc/bin/ptxas
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

from app.kernels.loader import COMPILE_OPTIONS, kernel_source


def nvrtc_ptx(lib: ctypes.CDLL, filename: str, names: list[str], arch: int,
              append: str = "") -> tuple[str, dict[str, str]]:
    """PTX of ``filename`` (then ``append``'s text) with the given template instances, and their
    lowered (mangled) names."""
    prog = ctypes.c_void_p()
    src = (kernel_source(filename) + "\n" + append).encode()
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src, filename.encode(), 0, None, None))
    for name in names:
        check(lib, lib.nvrtcAddNameExpression(prog, name.encode()))
    opts = [o.encode() for o in (*COMPILE_OPTIONS, f"--gpu-architecture=compute_{arch}", "-ftz=true")]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise SystemExit(f"NVRTC failed on {filename}:\n{log.value.decode()}")
    if log.value.strip():
        print(log.value.decode(), file=sys.stderr)
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    check(lib, lib.nvrtcGetPTX(prog, ptx))
    lowered = {}
    for name in names:
        out = ctypes.c_char_p()
        check(lib, lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out)))
        lowered[name] = out.value.decode()
    return ptx.value.decode(), lowered


def check(lib: ctypes.CDLL, rc: int) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise SystemExit(f"NVRTC error {rc}: {lib.nvrtcGetErrorString(rc).decode()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("source", help="kernel file in app/kernels, e.g. gemv.cu")
    ap.add_argument("names", nargs="+", help='instances, e.g. "gemv_kernel<4, 2, true, 1, 1>" or an extern "C" name')
    ap.add_argument("--arch", type=int, default=86)
    ap.add_argument("--append", type=Path, help="a .cu file compiled after the source (a probe's kernel)")
    ap.add_argument("--sass", action="store_true", help="print the SASS (needs cuobjdump)")
    ap.add_argument("--nvrtc", default="/tmp/nv/nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
    ap.add_argument("--ptxas", default="/tmp/nv/nvidia/cuda_nvcc/bin/ptxas")
    ap.add_argument("--cuobjdump", default="/tmp/nv2/nvidia/cu13/bin/cuobjdump")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.nvrtc)
    templated = [n for n in args.names if "<" in n]
    append = args.append.read_text() if args.append else ""
    ptx, lowered = nvrtc_ptx(lib, args.source, templated, args.arch, append)
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        ptx_path.write_text(ptx)
        res = subprocess.run([args.ptxas, f"-arch=sm_{args.arch}", "-v", str(ptx_path), "-o", str(cubin)],
                             capture_output=True, text=True, check=False)
        wanted = set(lowered.values()) | {n for n in args.names if "<" not in n}
        for line in res.stderr.splitlines():  # ptxas -v: one "Compiling entry" + usage line per kernel
            if any(w in line for w in wanted) or "registers" in line or "spill" in line or "error" in line:
                print(line)
        if res.returncode:
            raise SystemExit(res.returncode)
        if args.sass:
            for name in wanted:
                out = subprocess.run([args.cuobjdump, "-sass", "-fun", name, str(cubin)], capture_output=True,
                                     text=True, check=False)
                print(out.stdout or out.stderr)


if __name__ == "__main__":
    main()
