"""PEFT LoRA adapters merged into the dense weights at load time.

An adapter folder holds ``adapter_config.json`` (r, lora_alpha, target_modules, use_rslora,
optional rank/alpha patterns) and ``adapter_model.safetensors`` with
``base_model.model.<module>.lora_A.weight`` [r, in] and ``...lora_B.weight`` [out, r].
Merging: W' = W + scale · B @ A, scale = alpha / r (or alpha / sqrt(r) with rsLoRA).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from app.errors import ModelLoadError

_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.default)?\.weight$")


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _file_not_folder(path: Path) -> str:
    """A file given where the adapter's folder belongs (often one of the adapter's own files)."""
    hint = f"; give its folder, {path.parent}" if path.name in ADAPTER_FILES else ""
    return (f"{path} is a file, but a PEFT LoRA adapter is a folder holding {ADAPTER_FILES[0]} and "
            f"{ADAPTER_FILES[1]}{hint}")


class LoraAdapter:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        config_path, weights_path = (self.folder / name for name in ADAPTER_FILES)
        if self.folder.is_file():
            raise ModelLoadError(_file_not_folder(self.folder))
        if not self.folder.is_dir():
            raise ModelLoadError(f"{self.folder}: adapter folder not found")
        for path in (config_path, weights_path):
            if not path.is_file():
                raise ModelLoadError(f"{path}: file not found (a PEFT LoRA adapter needs it)")
        try:
            self.config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{config_path}: not valid JSON ({e})") from None
        self.weights_path = weights_path
        try:
            tensors = load_file(str(weights_path))
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(f"{weights_path}: cannot read safetensors file ({e})") from None
        self.pairs = self._pair(tensors)
        self.used: set[str] = set()

    def _pair(self, tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        a_b: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            m = _KEY.match(key)
            if m is None:
                continue  # e.g. modules_to_save; not merged
            a_b.setdefault(m["module"], {})[m["ab"]] = t
        pairs = {}
        for module, ab in a_b.items():
            if set(ab) != {"A", "B"}:
                raise ModelLoadError(f"{self.weights_path}: {module} has lora_{next(iter(ab))} without its pair")
            pairs[module] = (ab["A"], ab["B"])
        if not pairs:
            raise ModelLoadError(f"{self.weights_path}: no LoRA tensors found")
        return pairs

    def scale(self, module: str, rank: int) -> float:
        short = module.rsplit(".", 1)[-1]
        alpha = float(_pattern_value(self.config.get("alpha_pattern") or {}, module, short,
                                     self.config.get("lora_alpha", rank)))
        if self.config.get("use_rslora"):
            return alpha / math.sqrt(rank)
        return alpha / rank

    def merge(self, name: str, weight: torch.Tensor) -> torch.Tensor:
        """Return ``weight`` (HF tensor ``name``) with this adapter's delta added, if it has one."""
        if not name.endswith(".weight"):
            return weight
        module = name[: -len(".weight")]
        pair = self.pairs.get(module)
        if pair is None:
            return weight
        a, b = pair  # a [r, in], b [out, r]
        rank = a.shape[0]
        if b.shape[1] != rank or a.shape[1] != weight.shape[1] or b.shape[0] != weight.shape[0]:
            raise ModelLoadError(
                f"{self.weights_path}: {module} LoRA shapes A{tuple(a.shape)} B{tuple(b.shape)} "
                f"do not fit the base weight {tuple(weight.shape)}")
        self.used.add(module)
        delta = (b.float() @ a.float()) * self.scale(module, rank)
        return (weight.float() + delta).to(weight.dtype)

    def check_all_used(self) -> None:
        unused = sorted(set(self.pairs) - self.used)
        if unused:
            raise ModelLoadError(
                f"{self.weights_path}: LoRA modules not found in the base model: {', '.join(unused[:3])}"
                + (f" and {len(unused) - 3} more" if len(unused) > 3 else ""))


def _pattern_value(patterns: dict, module: str, short: str, default):
    for key, value in patterns.items():
        if key == short or module.endswith(key) or re.search(key, module):
            return value
    return default
