"""Hold all but a few SMs of the GPU, so a benchmark runs on the rest (a small GPU's SM count).

Each held SM runs one block of ``hold_sm`` that takes the SM's whole shared memory: every block
reserves at least 1 KB of it, so no other block fits beside it, whatever it asks for. With
``ga10x=True`` each free SM also gets a one-warp block that takes all but 100 KB of its shared
memory, what an RTX 30-series (GA10x) SM has (the registers, 64 K, are the same). Its 48-warp
limit (64 here) is not imitated: a holder of 16 warps would also take registers that a GA10x SM
still has (the one attempt hung, though the carveout, below, may have been why). Blocks of a
probe kernel launched while the SMs are held record where they ran; :meth:`HeldSMs.check` says
whether the hold was as meant.

While held, nothing may synchronize the whole device (the holders end only on release): time
with events on a stream (:func:`replay_us`). CUDA_MODULE_LOADING=EAGER should be set before CUDA
starts, so no module loads lazily while SMs are held. The release flag is written by a copy
from pinned host memory, which needs no SM: work that fits no free SM (:class:`HoldHung`) can
be let through with :meth:`HeldSMs.release_after_hang` and the run goes on.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from benchmarks.common import require_cupy

cupy = require_cupy()

GA10X_SHARED_BYTES = 100 << 10  # shared memory per SM of an RTX 30-series GPU

HOLD_SOURCE = r"""
extern "C" __global__ void hold_sm(const volatile int* release, int* smids) {
    extern __shared__ int reserved[];  // asked for at launch: what other blocks cannot have
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        smids[blockIdx.x] = (int)smid;
        while (*release == 0) __nanosleep(2000);
        reserved[0] = (int)smid;
    }
    __syncthreads();  // every warp stays resident, holding its slot, until the release
}
extern "C" __global__ void where_blocks_ran(int* smids) {
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        smids[blockIdx.x] = (int)smid;
    }
}
"""


class HeldSMs:
    """All but ``free`` SMs held inside ``with`` (and the free ones trimmed to a GA10x SM's
    shared memory when ``ga10x``)."""

    def __init__(self, free: int, ga10x: bool = False):
        props = cupy.cuda.runtime.getDeviceProperties(torch.cuda.current_device())
        self.total, self.free, self.ga10x = props["multiProcessorCount"], free, ga10x
        self.held = self.total - free
        module = cupy.RawModule(code=HOLD_SOURCE, options=("-std=c++17",))
        self.hold, self.where = module.get_function("hold_sm"), module.get_function("where_blocks_ran")
        self.whole = props["sharedMemPerBlockOptin"]
        reserve = props.get("reservedSharedMemPerBlock", 1024)
        self.trim = props["sharedMemPerMultiprocessor"] - GA10X_SHARED_BYTES - reserve
        self.hold.max_dynamic_shared_size_bytes = max(self.whole, self.trim)
        # All of L1 as shared memory: else a trimmed SM is configured with just enough shared
        # memory for the trimming block, none is left for others, and whatever needs some hangs.
        self.hold.preferred_shared_memory_carveout = 100
        self.release = cupy.ones(1, cupy.int32)
        self.flag_values = {v: cupy.cuda.alloc_pinned_memory(4) for v in (0, 1)}  # host sources of the flag
        for v, mem in self.flag_values.items():
            np.frombuffer(mem, np.int32, 1)[0] = v
        self.held_smids = cupy.full(self.held, -1, cupy.int32)
        self.trimmed_smids = cupy.full(free, -1, cupy.int32)
        self.probe_smids = cupy.full(8 * self.total, -1, cupy.int32)
        self.streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(3)]
        self._launch()  # warm: every kernel loaded before any SM is held
        self._set_release(1)
        cupy.cuda.Device().synchronize()

    def _set_release(self, value: int) -> None:
        """The flag written by a host-to-device copy on its own stream: a copy engine's work, no SM."""
        cupy.cuda.runtime.memcpyAsync(self.release.data.ptr, self.flag_values[value].ptr, 4,
                                      cupy.cuda.runtime.memcpyHostToDevice, self.streams[2].ptr)

    def _launch(self) -> None:
        with self.streams[0]:
            self.hold((self.held,), (32,), (self.release, self.held_smids), shared_mem=self.whole)
        if self.ga10x:
            with self.streams[1]:
                self.hold((self.free,), (32,), (self.release, self.trimmed_smids), shared_mem=self.trim)
        with self.streams[2]:
            self.where((self.probe_smids.size,), (32,), (self.probe_smids,))

    def __enter__(self) -> HeldSMs:
        for a in (self.held_smids, self.trimmed_smids, self.probe_smids):
            a.fill(-1)
        self._set_release(0)
        cupy.cuda.Device().synchronize()
        self._launch()
        self.streams[2].synchronize()  # the probe ran while the holders were resident
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._set_release(1)
        if exc_type is None:  # after a HoldHung: release_after_hang decides whether to wait
            cupy.cuda.Device().synchronize()

    def release_after_hang(self, stream: torch.cuda.Stream, limit_s: float = 30.0) -> bool:
        """After a :class:`HoldHung` on ``stream``: release the SMs and wait for the stuck work to
        run on them. False if it has not ended after ``limit_s`` (then only leaving the process helps)."""
        self._set_release(1)
        deadline = time.monotonic() + limit_s
        while not (stream.query() and self.streams[2].done):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        cupy.cuda.Device().synchronize()
        return True

    def check(self) -> dict:
        """Distinct held SMs, the probe's blocks only on the free ones (and those trimmed)."""
        held, probed = set(self.held_smids.get().tolist()), set(self.probe_smids.get().tolist())
        trimmed = set(self.trimmed_smids.get().tolist()) if self.ga10x else probed
        ok = len(held) == self.held and -1 not in held and not held & probed and probed <= trimmed
        if self.ga10x:
            ok = ok and len(trimmed) == self.free and -1 not in trimmed and not held & trimmed
        return dict(sms=self.total, held=len(held), trimmed=len(trimmed) if self.ga10x else 0,
                    probe_sms=len(probed), overlap=len(held & probed), ok=ok)


class HoldHung(RuntimeError):
    """Work did not finish while SMs were held: some block of it fits no free SM."""


def replay_us(replay, stream: torch.cuda.Stream, launches: int = 10, trials: int = 5,
              limit_s: float = 30.0) -> float:
    """Median µs per call of ``replay()`` on ``stream``, timed with events only. Raises
    :class:`HoldHung` when a trial has not ended after ``limit_s`` (the holders never release
    by themselves: the caller should record what it has and exit the process)."""
    samples = []
    with torch.cuda.stream(stream):
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(launches):
                replay()
            end.record(stream)
            deadline = time.monotonic() + limit_s
            while not end.query():
                if time.monotonic() > deadline:
                    raise HoldHung(f"not done after {limit_s:.0f} s")
                time.sleep(0.001)
            samples.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(samples)
