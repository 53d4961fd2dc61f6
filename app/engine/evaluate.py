"""Perplexity of a loaded model on a token sequence (quality checks for quantization)."""

from __future__ import annotations

import math

import torch

from app.engine.kv_cache import StaticKVCache
from app.engine.models.decoder import DecoderModel


@torch.inference_mode()
def negative_log_likelihood(model: DecoderModel, ids: list[int], window: int = 512) -> tuple[float, int]:
    """(summed negative log-likelihood, scored tokens) of ``ids`` in independent windows.

    Each window starts with an empty cache, so the score does not depend on what came before
    (standard non-overlapping evaluation); the first token of each window is not scored.
    """
    if len(ids) < 2:
        raise ValueError("need at least two tokens")
    device = model.embed_tokens.device
    cache = StaticKVCache(model.spec, 1, window, model.embed_tokens.dtype, device)
    total_nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            break
        tokens = torch.tensor(chunk, device=device)
        logits = model(tokens, 0, 0, cache, all_logits=True)  # [T, V]
        nll = torch.nn.functional.cross_entropy(logits[:-1].float(), tokens[1:], reduction="sum")
        total_nll += nll.item()
        count += len(chunk) - 1
    return total_nll, count


def perplexity(model: DecoderModel, ids: list[int], window: int = 512) -> float:
    """exp(mean negative log-likelihood) of ``ids``, scored in independent windows."""
    total_nll, count = negative_log_likelihood(model, ids, window)
    return math.exp(total_nll / count)
