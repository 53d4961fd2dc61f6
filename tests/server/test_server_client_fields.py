"""Every request field the installed openai client knows is one the server knows: taken
(sampling, messages), ignored (cache hints, metadata) or refused by name (tools, moderation).
None of them is "Unrecognized": a field a newer client adds fails here until it is sorted."""

from __future__ import annotations

import openai
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from app.server.protocol import CHAT_FIELDS, COMPLETION_FIELDS
from server_helpers import chat_body, raw_request

REQUIRED = {"model", "messages", "prompt"}  # the request's own content: no null to send


def client_fields(module) -> set[str]:
    """The keys of a create() call's TypedDicts (streaming and not), inherited ones included."""
    names: set[str] = set()
    for params in (module.CompletionCreateParamsNonStreaming, module.CompletionCreateParamsStreaming):
        for klass in params.__mro__:
            names |= set(getattr(klass, "__annotations__", {}))
    return names


ENDPOINTS = [("/v1/chat/completions", chat_create_params, CHAT_FIELDS),
             ("/v1/completions", completion_create_params, COMPLETION_FIELDS)]


@pytest.mark.parametrize(("path", "module", "known"), ENDPOINTS, ids=["chat", "completions"])
def test_the_server_knows_every_field_of_the_installed_client(path, module, known):
    fields = client_fields(module)
    assert {"model", "max_tokens", "stream"} <= fields  # the walk found the TypedDicts' keys
    assert sorted(fields - known) == [], f"openai {openai.__version__} sends fields {path} calls unrecognized"


@pytest.mark.parametrize(("path", "module", "known"), ENDPOINTS, ids=["chat", "completions"])
def test_every_client_field_sent_as_null_is_accepted(server, engine, path, module, known):
    """null asks for nothing: every documented field, refused or not, takes it (as OpenAI does)."""
    body = {name: None for name in client_fields(module) - REQUIRED}
    body.update(model=engine.model_id, max_tokens=2)
    body.update(chat_body(engine.model_id) if "chat" in path else {"prompt": "Once"})
    response = raw_request(server, "POST", path, body)
    assert response.status == 200, response.body


def test_prompt_cache_hints_are_ignored(client, engine):
    """A client that sets a cache policy for every provider (openai 3.6x's typed fields) is served."""
    response = client.chat.completions.create(
        model=engine.model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0,
        prompt_cache_key="k", prompt_cache_retention="24h", prompt_cache_options={"mode": "implicit", "ttl": "30m"})
    assert response.choices[0].message.content is not None


def test_moderation_is_refused_by_name(client, engine):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, moderation={"model": "omni-moderation-latest"})
    error = info.value.body
    assert (error["param"], error["code"]) == ("moderation", "unsupported_parameter")
    assert error["message"] == ("Unsupported parameter: 'moderation' is not supported by this server, which does "
                                "not run moderation.")
