"""A source's endpoint URL as the user types it: `models get --endpoint`, Settings → Models →
Hugging Face mirror. One check for both, so they accept and refuse the same text."""

from __future__ import annotations

# A Chinese input method types the full-width colon and slash ("https：／／hf-mirror.com"): read as ASCII.
_FULL_WIDTH = str.maketrans({"：": ":", "／": "/"})


def normalize_endpoint(text: str) -> str:
    """``text`` stripped, its full-width colons and slashes made ASCII."""
    return text.strip().translate(_FULL_WIDTH)


def endpoint_problem(url: str) -> str | None:
    """What keeps a normalized ``url`` from being an http(s) URL: "no scheme" (a bare host name, which
    https:// in front fixes), "other scheme" (ftp://…: https:// in front would make no URL), or None."""
    if url.startswith(("https://", "http://")):
        return None
    return "other scheme" if "://" in url else "no scheme"
