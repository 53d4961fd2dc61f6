"""Readers for the fields of a request body, and the 400s that name them in OpenAI's wording.

Every message is one sentence that names the field as OpenAI does (``'messages[0].role'``) and
says what was expected. A client's value is described by its JSON type ("got an array") rather
than echoed: an echoed dict or list would read as a Python repr, and could be megabytes. Only a
string that should have been one of a few names (a role, a content part type) is quoted back,
cut short.
"""

from __future__ import annotations

import json

from app.server.errors import ApiError, invalid_param

# Why a parameter is refused: the server generates one plain-text answer per request.
NO_TOOLS = "does not call tools (function calling)"
UNSUPPORTED_REASONS = {
    "tools": NO_TOOLS,
    "tool_choice": NO_TOOLS,
    "functions": NO_TOOLS,
    "function_call": NO_TOOLS,
    "n": "generates one choice per request (send several requests for several answers)",
    "best_of": "generates one choice per request",
    "logprobs": "does not return log probabilities",
    "top_logprobs": "does not return log probabilities",
    "response_format": "does not constrain answers to JSON",
    "logit_bias": "does not apply logit biases",
    "modalities": "answers in text only",
    "echo": "does not echo the prompt",
    "suffix": "does not fill in text between a prompt and a suffix",
    # documented OpenAI parameters of features this server does not have
    "reasoning_effort": "does not take reasoning settings",
    "verbosity": "does not adjust how long answers are (use max_tokens to cap them)",
    "prediction": "does not take predicted outputs",
    "audio": "answers in text only",
    "web_search_options": "does not search the web",
    "moderation": "does not run moderation",
}


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, with its article: "a string", "an array"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def quoted(text: str, limit: int = 100) -> str:
    """A client's string in single quotes, as OpenAI quotes values, cut to ``limit`` characters."""
    return f"'{text if len(text) <= limit else text[:limit] + '...'}'"


def shown(value: object) -> str:
    """A value the server itself accepts (never the client's), written as JSON writes it."""
    return quoted(value) if isinstance(value, str) else json.dumps(value)


def invalid_type(param: str, expected: str, value: object) -> ApiError:
    return invalid_param(param, f"Invalid type for '{param}': expected {expected}, but got {json_type(value)} "
                                f"instead.", code="invalid_type")


def invalid_value(param: str, why: str) -> ApiError:
    return invalid_param(param, f"Invalid value for '{param}': {why}.")


def missing(param: str) -> ApiError:
    return invalid_param(param, f"Missing required parameter: '{param}'.", code="missing_required_parameter")


def unsupported_value(param: str, value: str, reason: str) -> ApiError:
    """A known name this server does not take, in OpenAI's words for a role a model refuses."""
    return invalid_param(param, f"Unsupported value: '{param}' does not support {quoted(value)} on this server, "
                                f"which {reason}.", code="unsupported_value")


def same_json(value: object, neutral: object) -> bool:
    """``value`` is ``neutral`` as JSON sees it: true is not 1, 1.0 is not 1 (Python's == says both are)."""
    if json_type(value) != json_type(neutral):
        return False
    if isinstance(neutral, list):
        return len(value) == len(neutral) and all(same_json(v, n) for v, n in zip(value, neutral))
    if isinstance(neutral, dict):
        return value.keys() == neutral.keys() and all(same_json(value[k], n) for k, n in neutral.items())
    return value == neutral


def refuse_unless(body: dict, name: str, *neutral: object, expected: str | None = None) -> None:
    """Refuse ``name`` unless it is absent, null or one of the values that ask for nothing extra.

    ``expected`` (a JSON type with its article, "an integer") is the field's type in OpenAI's API:
    a value of another type is invalid_type, as OpenAI answers it, before asking whether it is neutral.
    """
    value = body.get(name)
    if value is None or any(same_json(value, n) for n in neutral):
        return
    if expected is not None and json_type(value) != expected:
        raise invalid_type(name, expected, value)
    reason = UNSUPPORTED_REASONS[name]
    if all(n in ([], {}, "") for n in neutral):  # only "nothing" is allowed: not worth suggesting
        message = f"Unsupported parameter: '{name}' is not supported by this server, which {reason}."
        raise invalid_param(name, message, code="unsupported_parameter")
    allowed = " or ".join(shown(n) for n in neutral)
    raise invalid_param(name, f"Unsupported value: '{name}' can only be {allowed} on this server, which {reason}.",
                        code="unsupported_value")


def check_known(body: dict, allowed: frozenset[str], where: str = "") -> None:
    """OpenAI's answer to a field it does not know; ``where`` prefixes a nested object's keys."""
    for name in body:
        if name not in allowed:
            param = where + (name if len(name) <= 100 else name[:100] + "...")
            raise invalid_param(param, f"Unrecognized request argument supplied: {param}.",
                                code="unsupported_parameter")


# -- typed readers: the value, None when absent or null, or the 400 --------------------------------
def number(body: dict, name: str, where: str = "") -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid_type(where + name, "a number", value)
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        raise invalid_value(where + name, "the number is out of range") from None


def integer(body: dict, name: str, where: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_type(where + name, "an integer", value)
    return value


def boolean(body: dict, name: str, where: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid_type(where + name, "a boolean", value)
    return value
