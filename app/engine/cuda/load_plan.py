"""The VRAM plan of one load: the budget resolved against the card, the plan, and the fitted
shape where the asked requests x context do not fit (pure: the card comes as a GpuInfo)."""

from __future__ import annotations

import logging

from app.engine.cuda.memory import (
    BESIDE_ALLOCATOR, GpuInfo, MemoryPlan, MiB, VramBudgetError, fitted_shape, gib, plan_memory, resolve_budget,
)
from app.formats.spec import ModelSpec

log = logging.getLogger(__name__)


def plan_load(spec: ModelSpec, weights_bytes: int, gpu: GpuInfo, *, num_slots: int, max_context: int,
              vram_budget: int | None, label: str, fit: bool = False, **plan_options) -> MemoryPlan:
    """The plan for ``num_slots`` requests of ``max_context`` tokens within ``vram_budget``
    (default: memory.default_budget), or :class:`VramBudgetError`. A requested budget above what
    the card can give beside what CUDA takes is lowered, and a refusal says so. ``fit``: where
    the asked shape does not fit, plan memory.fitted_shape's (the plan's num_slots / max_context).
    ``plan_options``: memory.plan_memory's keywords (dense_decode, quantized, prefill_mode, ...)."""
    budget = resolve_budget(vram_budget, gpu)
    lowered = "" if vram_budget is None or budget >= vram_budget else (
        f"--vram-budget {gib(vram_budget)} lowered to {gib(budget)}: {gib(gpu.free_bytes)} free less the "
        f"{BESIDE_ALLOCATOR // MiB} MiB CUDA takes beside the budget")
    if lowered:
        log.warning("%s", lowered)

    def plan_for(slots: int, context: int) -> MemoryPlan:
        return plan_memory(spec, weights_bytes, num_slots=slots, max_context=context, budget_bytes=budget, gpu=gpu,
                           label=label, **plan_options)

    try:
        return plan_for(num_slots, max_context)
    except VramBudgetError as e:
        shape = fitted_shape(spec, weights_bytes, num_slots=num_slots, max_context=max_context, budget_bytes=budget,
                             gpu=gpu, dense_decode=plan_options.get("dense_decode", False)) if fit else None
        if shape is None:
            raise VramBudgetError(f"{e} ({lowered})" if lowered else str(e)) from None
    log.warning("%s: %d requests x %d tokens do not fit %s of VRAM; loading with %d x %d", label, num_slots,
                max_context, gib(budget), *shape)
    return plan_for(*shape)
