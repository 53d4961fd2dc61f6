"""Checks that keep web pages and other users away from a local model server.

A server on 127.0.0.1 is still reachable by every page the user's browser opens:
- DNS rebinding: a page on ``evil.example`` re-resolves its own name to 127.0.0.1 and then
  talks to us same-origin. Its requests carry ``Host: evil.example``, so only loopback names,
  the bound address and names the user allowed are accepted.
- Cross-site requests: a page may POST to ``http://127.0.0.1:18000`` without reading the
  answer (a "simple" request skips the CORS preflight) and burn the GPU. Browsers always send
  ``Origin`` then, so a request with an Origin that is not on the allow-list is refused.
"""

from __future__ import annotations

import hmac
import re

from app.server.config import ServerConfig, cors_origin_problem, is_loopback_host, is_wildcard_host, parse_ip
from app.server.errors import ApiError

DEFAULT_ALLOWED_HEADERS = "Authorization, Content-Type"
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}")  # RFC 9110 token, cut to a sane length


def host_name(host_header: str) -> str:
    """The name part of a Host header: 'localhost:18000' -> 'localhost', '[::1]:80' -> '[::1]'."""
    value = host_header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[: end + 1] if end >= 0 else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def host_allowed(host_header: str | None, config: ServerConfig) -> bool:
    if not host_header:
        return False
    name = host_name(host_header)
    if is_loopback_host(name) or name in config.allowed_hosts:
        return True
    bound = config.host.strip().lower()
    if name == bound or name == f"[{bound}]":
        return True
    # Bound to all interfaces on purpose: any IP literal is the machine's own address (a
    # rebinding page always uses a name), so LAN clients that use the IP are fine.
    return config.allow_remote and is_wildcard_host(config.host) and parse_ip(name) is not None


def check_host(host_header: str | None, config: ServerConfig) -> None:
    if not host_header:
        raise ApiError(400, "Missing Host header.", code="missing_host")
    if not host_allowed(host_header, config):
        raise ApiError(403, f"Host '{host_name(host_header)}' is not allowed (DNS-rebinding protection); "
                            "use 127.0.0.1 or localhost, or allow the name with --allowed-host.",
                       code="host_not_allowed")


def origin_allowed(origin: str, config: ServerConfig) -> bool:
    return "*" in config.cors_origins or origin.rstrip("/") in config.cors_origins


def check_origin(origin: str | None, config: ServerConfig) -> None:
    """Non-browser clients send no Origin; browsers must come from an allowed origin."""
    if origin is not None and not origin_allowed(origin, config):
        problem = cors_origin_problem(origin.rstrip("/"))  # the option would refuse it: say why, not to use it
        advice = (f"; start the server with --cors-origin {origin} to let that web page call it" if problem is None
                  else f", and --cors-origin '{origin}' {problem}")
        raise ApiError(403, f"Origin '{origin}' is not allowed{advice}.", code="origin_not_allowed")


def cors_headers(origin: str | None, config: ServerConfig) -> dict[str, str]:
    """Headers for an allowed cross-origin response (none for same-origin/non-browser calls).

    With --cors-origin set, an answer depends on the request's Origin, so every answer says so
    (``Vary: Origin``): a cache must not hand a page an answer made for another origin or none.
    """
    if not config.cors_origins:
        return {}
    if origin is None:
        return {"Vary": "Origin"}
    if not origin_allowed(origin, config):
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def preflight_headers(origin: str | None, request_headers, config: ServerConfig) -> dict[str, str]:
    """The answer to a CORS preflight (the Origin, if any, was allowed: check_origin runs first).

    An allowed page may send whatever headers it asks for: the official openai JS SDK adds its
    ``X-Stainless-*`` headers, and a fixed list would make browsers block it. A disallowed
    origin never gets here (403), so this opens nothing to other pages.
    """
    headers = cors_headers(origin, config)
    requested = allowed_request_headers(request_headers.get("Access-Control-Request-Headers"))
    headers.update({
        "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": requested if origin is not None and requested else DEFAULT_ALLOWED_HEADERS,
        "Access-Control-Max-Age": "600",
    })
    if "Access-Control-Allow-Origin" in headers:  # the answer depends on what the preflight asked
        headers["Vary"] = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"
    # Chrome's Private Network Access asks before a public page may reach a loopback server.
    if request_headers.get("Access-Control-Request-Private-Network") == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    return headers


def allowed_request_headers(requested: str | None) -> str:
    """The header names a preflight asked for (``Access-Control-Request-Headers``), each a valid
    HTTP token (RFC 9110's tchar), joined as the answer lists them; "" when none is valid."""
    if not requested:
        return ""
    names = [name.strip() for name in requested.split(",")]
    return ", ".join(name for name in names if name and HEADER_NAME.fullmatch(name))


def check_api_key(authorization: str | None, config: ServerConfig) -> None:
    api_key = config.api_key  # read once: the tray may change it meanwhile (ServerHandle.set_api_key)
    if api_key is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    # compare_digest: the time taken does not leak how much of the key matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        message = ("You didn't provide an API key; send 'Authorization: Bearer KEY'." if not authorization
                   else "Incorrect API key provided.")
        raise ApiError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
