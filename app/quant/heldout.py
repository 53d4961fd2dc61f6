"""Held-out evaluation: perplexity of a model folder on texts no quantizer calibrates on.

One evaluator for everything that claims a quality number: ``qwen-tray checkpoint eval``,
``python -m benchmarks.quality`` and its llama.cpp peers. The texts ship with the app
(``app/resources/text/heldout_{en,zh}.txt``, CC0; the calibration text is a different
document). Each is cut into non-overlapping windows of 512 tokens, each window scored from an
empty cache; a folder's score is the perplexity per text and over all scored tokens together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from app.engine.evaluate import negative_log_likelihood
from app.engine.loading import load_model
from app.errors import QwenTrayError

WINDOW = 512
TEXT_DIR = Path(__file__).resolve().parent.parent / "resources" / "text"
HELDOUT_FILES = {"en": "heldout_en.txt", "zh": "heldout_zh.txt"}


def heldout_file(language: str) -> Path:
    if language not in HELDOUT_FILES:
        raise QwenTrayError(f"no held-out text for {language!r} (known: {', '.join(HELDOUT_FILES)})")
    path = TEXT_DIR / HELDOUT_FILES[language]
    if not path.is_file():
        raise QwenTrayError(f"held-out text {path} is missing from the installation")
    return path


def heldout_ids(tokenizer, language: str, vocab_size: int, max_tokens: int | None = None) -> list[int]:
    """Token ids of the held-out text in ``language`` (its first ``max_tokens``, if given)."""
    ids = tokenizer.encode(heldout_file(language).read_text(encoding="utf-8"))
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if ids and max(ids) >= vocab_size:
        raise QwenTrayError(f"{tokenizer.source}: token id {max(ids)} is outside the model's vocabulary "
                            f"({vocab_size}); does the tokenizer belong to this model?")
    return ids


@dataclass
class HeldoutScore:
    """Perplexity per held-out text and over all of them (tokens-weighted)."""

    perplexity: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    overall: float = float("nan")

    def to_dict(self) -> dict:
        return {"perplexity": self.perplexity, "tokens": self.tokens, "overall": self.overall}


@torch.inference_mode()
def score_model(model, tokenizer, vocab_size: int, languages: tuple[str, ...] = tuple(HELDOUT_FILES),
                max_tokens: int | None = None, window: int = WINDOW) -> HeldoutScore:
    score = HeldoutScore()
    total_nll, total = 0.0, 0
    for language in languages:
        nll, count = negative_log_likelihood(model, heldout_ids(tokenizer, language, vocab_size, max_tokens), window)
        score.perplexity[language] = math.exp(nll / count)
        score.tokens[language] = count
        total_nll, total = total_nll + nll, total + count
    score.overall = math.exp(total_nll / total)
    return score


def score_folder(path: Path, device: torch.device | str = "cpu", languages: tuple[str, ...] = tuple(HELDOUT_FILES),
                 max_tokens: int | None = None) -> HeldoutScore:
    """Load a model folder (Hugging Face or quantized checkpoint) and score it on the held-out texts."""
    loaded = load_model(Path(path), torch.device(device), max_context=WINDOW)
    try:
        return score_model(loaded.model, loaded.tokenizer, loaded.spec.vocab_size, languages, max_tokens)
    finally:
        del loaded
