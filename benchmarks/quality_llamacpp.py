"""llama.cpp's quantizer as the peer of benchmarks/quality.py: built from source, run on the CPU.

``llama-quantize`` and ``llama-imatrix`` are built from the ``llama-cpp-python`` sdist (the
llama.cpp sources it vendors), only those two targets, and cached under
``~/.cache/qwen-tray/llamacpp`` so a second run reuses them. Every variant is written as a
GGUF and converted back to a Hugging Face folder by the app's own GGUF importer, so it is
scored by the same evaluator as our checkpoints.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

CACHE = Path.home() / ".cache" / "qwen-tray" / "llamacpp"
TARGETS = ("llama-quantize", "llama-imatrix")


@dataclass(frozen=True)
class Variant:
    label: str
    qtype: str  # llama-quantize's type name
    imatrix: bool = False
    pure: bool = False  # every tensor the same type (no 8-bit embedding/head, no K-quant mix)

    @property
    def key(self) -> str:
        """Short name for --llamacpp: Q4_0, Q4_0+im, Q4_0-pure+im, ..."""
        return f"{self.qtype}{'-pure' if self.pure else ''}{'+im' if self.imatrix else ''}"


VARIANTS = tuple(Variant(f"{q}{' + imatrix' if im else ''}", q, im) for q in ("Q4_0", "Q4_K_M", "Q3_K_S", "Q3_K_M")
                 for im in (False, True)) + (Variant("Q4_0 --pure", "Q4_0", False, True),
                                             Variant("Q4_0 --pure + imatrix", "Q4_0", True, True))


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(map(str, cmd)) + "\n").encode())
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} failed with exit code {proc.returncode}; see {log}")


def build(cache: Path = CACHE) -> Path:
    """The folder holding llama-quantize and llama-imatrix (built once, then reused)."""
    bin_dir = cache / "build" / "bin"
    if all((bin_dir / t).is_file() for t in TARGETS):
        return bin_dir
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "build.log"
    sdists = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(cache),
              "llama-cpp-python"], log)
        sdists = sorted(cache.glob("llama_cpp_python-*.tar.gz"))
    source = cache / sdists[-1].name.removesuffix(".tar.gz")
    if not source.is_dir():
        with tarfile.open(sdists[-1]) as tar:
            tar.extractall(cache, filter="data")
    llama = source / "vendor" / "llama.cpp"
    _run(["cmake", "-S", str(llama), "-B", str(cache / "build"), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
          "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
          "-DBUILD_SHARED_LIBS=OFF"], log)
    _run(["cmake", "--build", str(cache / "build"), "-j", "2", "--target", *TARGETS], log)
    return bin_dir


def llamacpp_version(bin_dir: Path) -> str:
    source = next(iter(sorted(bin_dir.parents[1].glob("llama_cpp_python-*"))), None)
    return source.name.removeprefix("llama_cpp_python-") if source else "unknown"


def f16_gguf(bin_dir: Path, source_gguf: Path, out: Path, log: Path) -> Path:
    """The source GGUF with every quantized tensor dequantized to F16 (the common start point)."""
    if not out.is_file():
        _run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(source_gguf), str(out), "F16"], log)
    return out


def imatrix(bin_dir: Path, f16: Path, calibration_text: Path, out: Path, log: Path) -> Path:
    """llama.cpp's importance matrix from the same calibration text our calibrated methods use."""
    if not out.is_file():
        _run([str(bin_dir / "llama-imatrix"), "-m", str(f16), "-f", str(calibration_text), "-o", str(out),
              "-c", "512", "-t", "2"], log)
    return out


def quantize(bin_dir: Path, f16: Path, variant: Variant, out: Path, imatrix_file: Path | None, log: Path) -> Path:
    cmd = [str(bin_dir / "llama-quantize")]
    if variant.pure:
        cmd.append("--pure")
    if variant.imatrix:
        cmd += ["--imatrix", str(imatrix_file)]
    _run([*cmd, str(f16), str(out), variant.qtype, "2"], log)
    return out


def gguf_bits(path: Path) -> dict[str, float]:
    """Bits per weight of the linear layers, of the embedding/head tables, and of all 2-D weights."""
    sums = {"linear": [0, 0], "tables": [0, 0]}
    for t in GGUFReader(path).tensors:
        if len(t.shape) != 2:
            continue
        qtype = GGMLQuantizationType(t.tensor_type)
        block, size = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(t.shape.tolist()))
        kind = "tables" if t.name.startswith(("token_embd", "output.")) else "linear"
        sums[kind][0] += n * size * 8 // block
        sums[kind][1] += n
    total_bits = sums["linear"][0] + sums["tables"][0]
    total_n = sums["linear"][1] + sums["tables"][1]
    return {"linear": sums["linear"][0] / sums["linear"][1], "tables": sums["tables"][0] / max(sums["tables"][1], 1),
            "overall": total_bits / total_n}


def gguf_types(path: Path) -> dict[str, dict[str, int]]:
    """How many tensors of each role (attn_q, ffn_down, token_embd, ...) got each type: a K-quant
    mix falls back to other types where a row is not a multiple of 256 (SmolLM2's 576 columns)."""
    types: dict[str, dict[str, int]] = {}
    for t in GGUFReader(path).tensors:
        if len(t.shape) == 2:
            role = t.name.removesuffix(".weight").rsplit(".", 1)[-1]
            qtype = GGMLQuantizationType(t.tensor_type).name
            types.setdefault(role, {}).setdefault(qtype, 0)
            types[role][qtype] += 1
    return types
