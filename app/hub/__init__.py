"""Getting a model: the catalog, downloads from the Hugging Face Hub (or a mirror) and ModelScope,
and the job that quantizes and registers what was downloaded (docs/ARCHITECTURE.md)."""
