"""A Llama-style decoder (Llama 2/3, SmolLM2, Qwen2/2.5) composed from app.engine.layers.

The model file only composes layers; what differs between architectures is in ModelSpec
(biases, rope scaling, tied embeddings), and quantization is a module swap done elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from app.engine.layers import DecoderLayer, Linear, RMSNorm, rope_tables
from app.formats.spec import ModelSpec


class DecoderModel(nn.Module):
    def __init__(self, spec: ModelSpec, max_positions: int):
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = None if spec.tie_word_embeddings else Linear(spec.hidden_size, spec.vocab_size)
        self.max_positions = max_positions
        # Filled by init_rope() once the model sits on its device (it is built on "meta").
        self.register_buffer("rope_cos", torch.empty(max_positions, spec.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(max_positions, spec.head_dim), persistent=False)

    def init_rope(self) -> None:
        """Compute the RoPE tables in fp32 (as HF does), stored in the model dtype."""
        cos, sin = rope_tables(self.spec, self.max_positions)
        self.rope_cos = cos.to(self.rope_cos.device, self.rope_cos.dtype)
        self.rope_sin = sin.to(self.rope_sin.device, self.rope_sin.dtype)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_tokens)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens)
        return self.lm_head(hidden)

    def forward(self, ids: torch.Tensor, start: int, slot: int, cache, all_logits: bool = False) -> torch.Tensor:
        """Run T tokens of one sequence at positions start..start+T-1 through the model.

        ids [T] → logits [T, V] (all_logits) or [V] for the last token only (the usual case:
        the lm_head over a whole prompt costs more than the rest of a small model).
        """
        t = ids.shape[0]
        cache.check_range(slot, start, t)
        rope = (self.rope_cos[start:start + t], self.rope_sin[start:start + t])
        x = self.embed(ids)  # [T, hidden]
        for layer in self.layers:
            x = layer(x, start, slot, cache, rope)
        x = self.norm(x if all_logits else x[-1:])
        out = self.logits(x).float()
        return out if all_logits else out[0]
