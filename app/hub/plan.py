"""What a catalog entry will cost and where it will run, computed before anything is downloaded.

Sizes come from the entry's architecture through the recipe planner (app/formats/recipe.py):
the download is the source's weights in their dtype (config's torch_dtype: 2 bytes a weight for
bfloat16/float16, 4 for float32), the checkpoint the recipe's packed weights. This is the
estimate before any request; a job, once the hub has listed the files, counts the listing's real
sizes (the disk check, the download's progress and total). Where
it runs is the VRAM planner's verdict for the checkpoint under the tray's load (app/engine/cuda/fit.py,
the same as `qwen-tray doctor`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.engine.cuda.fit import Fit, Machine, model_fit
from app.errors import QwenTrayError
from app.formats.recipe import Recipe, hf_tensor_shapes, load_recipe, plan_model
from app.hub.catalog import CatalogEntry, CatalogError

SOURCE_WEIGHTS = Recipe("source", ())  # every weight as stored: 16 bits (scaled to the dtype below)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # torch_dtype -> bytes a weight on the hub


def source_bytes_per_weight(torch_dtype: str) -> int:
    """Bytes a weight takes in the source checkpoint ("torch.float32" and "float32" alike; an
    unknown dtype counts as 16-bit, what nearly every hub model is)."""
    return DTYPE_BYTES.get(torch_dtype.removeprefix("torch."), 2)


@dataclass(frozen=True)
class EntryPlan:
    entry: CatalogEntry
    recipe: str
    download_bytes: int | None  # None: the entry gives no architecture
    checkpoint_bytes: int | None
    fit: Fit | None  # None without a machine or an architecture


def plan_entry(entry: CatalogEntry, machine: Machine | None = None, recipe: str | None = None) -> EntryPlan:
    """The entry's sizes and fit; a :class:`CatalogError` naming the entry when its [config]
    cannot be planned (callers show it for that entry and go on with the others)."""
    recipe = recipe or entry.recipe
    spec = entry.spec
    if spec is None:
        return EntryPlan(entry, recipe, None, None, None)
    try:
        shapes = hf_tensor_shapes(entry.config)
        download = plan_model(SOURCE_WEIGHTS, shapes).total_bytes * source_bytes_per_weight(spec.torch_dtype) // 2
        checkpoint = plan_model(load_recipe(recipe), shapes).total_bytes
    except KeyError as e:
        raise CatalogError(f"catalog entry {entry.name}: [config] lacks {e.args[0]!r}") from None
    except (TypeError, ValueError, QwenTrayError) as e:
        raise CatalogError(f"catalog entry {entry.name}: cannot plan its sizes ({e})") from None
    fit = None
    if machine is not None:
        logging.disable(logging.WARNING)  # the planner's warnings are about a real load, not this what-if
        try:
            fit = model_fit(spec, checkpoint, quantized=True, machine=machine, label=entry.model_name(recipe))
        finally:
            logging.disable(logging.NOTSET)
    return EntryPlan(entry, recipe, download, checkpoint, fit)
