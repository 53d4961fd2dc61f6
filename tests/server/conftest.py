"""Fixtures for the HTTP server tests: one tiny real engine, real servers on free loopback ports."""

from __future__ import annotations

import pytest

from app.server import start_server_in_thread


@pytest.fixture(scope="session")
def engine(tiny_qwen_dir):
    from app.engine import Engine

    eng = Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=4)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def server(engine):
    """The default server: loopback, no API key, no CORS origins."""
    handle = start_server_in_thread(engine, port=0)
    yield handle
    handle.stop()


@pytest.fixture
def make_server(engine):
    """Start extra servers with other options; all are stopped at the end of the test."""
    handles = []

    def start(provider=None, port=0, **options):
        handle = start_server_in_thread(engine if provider is None else provider, port=port, **options)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
