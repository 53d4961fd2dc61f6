"""Server-sent events as OpenAI uses them: ``data: <json>\\n\\n`` events ending with ``data: [DONE]``.

Stdlib only: the server writes events with encode_event; iter_event_data reads them back for the
serve benchmark's own client (benchmarks/serve.py) and the tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

DONE = "[DONE]"


def encode_event(payload: dict | str) -> bytes:
    """One SSE event. A dict becomes compact JSON (one line: JSON escapes newlines)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode("utf-8")


def iter_event_data(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The ``data`` of each event in a stream of lines (SSE spec: multi-line data joined by \\n).

    Comments (``:`` lines) and other fields (``event:``, ``id:``, ``retry:``) are skipped.
    """
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
