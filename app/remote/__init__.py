"""The client of remote OpenAI-compatible endpoints, through the ``openai`` SDK: the tray's
remote models (app/ui/backend/remote.py) and ``qwen-tray ask --server`` use this one client.

Why the SDK rather than a hand-written client: it speaks the API's streaming format and raises
one typed error per failure (connection, timeout, 401, 404, 429, other statuses), which become
one sentence each here; it is the client these endpoints are made for; and its HTTP client
honours the system proxy (``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY``, and Windows' and
macOS' own proxy settings through urllib's ``getproxies``). A caller's proxy choice overrides
that: ``DIRECT`` (no proxy) or a proxy URL.

No retries (the tray's popup has Retry; a 429 says how long to wait instead); the connection
has ``CONNECT_TIMEOUT_S``, each read the client's ``timeout_s``. Cancelling shuts the socket
down, which ends the blocking read in the streaming thread at once.
"""

from app.remote.client import CONNECT_TIMEOUT_S, DIRECT, FixHints, RemoteClient, is_http_url
from app.remote.errors import RemoteConnectionError, RemoteError
from app.remote.stream import Message, RemoteStream, estimate_chat_tokens, estimate_tokens, request_arguments

__all__ = [
    "CONNECT_TIMEOUT_S", "DIRECT", "FixHints", "Message", "RemoteClient", "RemoteConnectionError", "RemoteError",
    "RemoteStream", "estimate_chat_tokens", "estimate_tokens", "is_http_url", "request_arguments",
]
