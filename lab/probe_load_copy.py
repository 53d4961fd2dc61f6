"""How fast a checkpoint's bytes reach the GPU from the page cache: the loader's way (safetensors'
memory map, one synchronous copy per tensor) against reading the files in large chunks into two
pinned host buffers whose copies overlap the next read.

    python -m lab.probe_load_copy CHECKPOINT_FOLDER [--rounds 3]

Prints seconds and GB/s of each way per round (the files are read once first, so both start from
the page cache). A timing probe: the bytes are not checked (the loader's tests do that).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from safetensors import safe_open

CHUNK = 64 << 20


def mmap_way(files: list[Path], out: torch.Tensor) -> None:
    at = 0
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                t = handle.get_tensor(name).reshape(-1).view(torch.uint8)
                out[at:at + t.numel()].copy_(t)
                at += t.numel()


def pinned_way(files: list[Path], out: torch.Tensor, buffers: list[torch.Tensor], events: list) -> None:
    at, turn = 0, 0
    stream = torch.cuda.current_stream()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while True:
                buf, done = buffers[turn % 2], events[turn % 2]
                done.synchronize()  # its last copy has left the buffer
                n = f.readinto(buf.numpy())
                if not n:
                    break
                out[at:at + n].copy_(buf[:n], non_blocking=True)
                done.record(stream)
                at += n
                turn += 1
    torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    files = sorted(args.folder.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)
    for f in files:
        f.read_bytes()  # into the page cache
    out_a = torch.empty(total, dtype=torch.uint8, device="cuda")
    out_b = torch.empty(total, dtype=torch.uint8, device="cuda")
    started = time.perf_counter()
    buffers = [torch.empty(CHUNK, dtype=torch.uint8).pin_memory() for _ in range(2)]
    events = [torch.cuda.Event() for _ in range(2)]
    for e in events:
        e.record()
    print(f"pinning 2 x {CHUNK >> 20} MiB: {time.perf_counter() - started:.3f} s")
    for r in range(args.rounds):
        for name, way in (("mmap", lambda: mmap_way(files, out_a)),
                          ("pinned", lambda: pinned_way(files, out_b, buffers, events))):
            torch.cuda.synchronize()
            started = time.perf_counter()
            way()
            torch.cuda.synchronize()
            s = time.perf_counter() - started
            print(f"round {r} {name}: {s:.3f} s, {total / s / 1e9:.2f} GB/s ({total / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
