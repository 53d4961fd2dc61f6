"""``qwen-tray serve``: the OpenAI-compatible endpoint as a foreground command.

The socket listens before the model loads, so ``GET /health`` answers "loading" at once
and clients can poll it; generation requests get 503 until the model is ready.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from app.errors import QwenTrayError
from app.server.config import API_KEY_ENV, DEFAULT_HOST, DEFAULT_MAX_QUEUED, DEFAULT_PORT, ServerConfig, is_loopback_host
from app.server.provider import EngineSlot

log = logging.getLogger("app.server")
DEFAULT_BATCH = 4  # --max-batch-size unless given
# The tray's default idle unload: a laptop's GPU goes back to the desktop (games, video) when the
# API is not used, at the cost of one load (seconds, kernels cached) for the next request after a
# pause. Ollama's default is 5m for a server that swaps models; ours holds one.
DEFAULT_KEEP_ALIVE = "10m"


def register(sub) -> None:
    """Add the ``serve`` subcommand to ``qwen-tray``'s subparsers (app/cli.py plugs it in)."""
    parser = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                            description="Serve a model on an OpenAI-compatible HTTP API "
                                        "(base URL http://127.0.0.1:18000/v1 by default).")
    add_serve_arguments(parser)
    parser.set_defaults(func=run_serve)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, metavar="NAME|PATH",
                        help="model folder (Hugging Face layout or quantized checkpoint) or registered name "
                             "(default: the configured default model)")
    parser.add_argument("--host", default=DEFAULT_HOST, metavar="ADDRESS",
                        help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N",
                        help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    parser.add_argument("--model-id", default=None, metavar="NAME",
                        help="model name clients send (default: the registered name of --model, or its folder's name)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--max-batch-size", type=_at_least(1), default=None, metavar="N",
                        help=f"requests generated together (KV-cache slots; default {DEFAULT_BATCH}, "
                             "or fewer with a shorter context where the GPU cannot hold them)")
    parser.add_argument("--max-context", type=_at_least(2), default=None, metavar="N",
                        help="tokens per request, prompt + answer (default: model max, at most 4096)")
    parser.add_argument("--vram-budget", type=_memory_size, default=None, metavar="SIZE",
                        help="GPU memory the model may use, e.g. 3.2GiB (default: free memory minus a margin)")
    parser.add_argument("--verify", action="store_true",
                        help="hash every file of a quantized checkpoint against its manifest, even those "
                             "verified before and unchanged since (default: only files changed since)")
    parser.add_argument("--lookup-draft", type=int, default=None, metavar="N",
                        help="GPU: at most N tokens guessed per step from the request's own text and checked "
                             "in one step: the same output, faster when the answer repeats text (0 = off; "
                             "default: on)")
    parser.add_argument("--keep-alive", type=_keep_alive, default=DEFAULT_KEEP_ALIVE, metavar="DURATION",
                        help="unload the model after this long without requests, and load it again for the next "
                             "one (Ollama's convention: 5m, 1h, 90s; 0 = right after each request; -1 = never; "
                             f"default {DEFAULT_KEEP_ALIVE}, as the tray)")
    parser.add_argument("--max-queued", type=int, default=DEFAULT_MAX_QUEUED, metavar="N",
                        help=f"requests allowed to wait for a slot; more get HTTP 429 (default {DEFAULT_MAX_QUEUED})")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV} if set)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="let web pages from ORIGIN (e.g. http://localhost:3000) call the API; repeatable")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="accept this Host header name besides localhost/the bound address; repeatable")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow --host to be a non-loopback address (exposes the model to the network)")


def _at_least(minimum: int):
    """An argparse type: an integer >= ``minimum`` (0 must not silently mean "the default")."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _keep_alive(text: str) -> float | None:
    """An argparse type: seconds, or None for never (app.engine.keep_alive.parse_keep_alive)."""
    from app.engine.keep_alive import parse_keep_alive  # imports torch: only when serve is parsed

    try:
        return parse_keep_alive(text)
    except QwenTrayError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--keep-alive: ")) from None


def _memory_size(text: str) -> int:
    """An argparse type: bytes from '3.2GiB', '3200MiB', '800M' or plain bytes, parsed on every
    machine (a typo is refused on a CPU-only one too, not only where the GPU would use it)."""
    from app.engine.cuda.memory import size_in_bytes  # imports torch: only when the option is given

    try:
        return size_in_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        host=args.host, port=args.port, model_id=args.model_id,
        api_key=args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV),
        cors_origins=tuple(args.cors_origin), allowed_hosts=tuple(args.allowed_host),
        allow_remote=args.allow_remote, max_queued=args.max_queued)


def _warn_exposure(config: ServerConfig) -> None:
    if not is_loopback_host(config.host):
        auth = "API key required" if config.api_key else "NO API key: anyone on the network can use it"
        print(f"warning: listening on {config.host}:{config.port}, reachable from other machines ({auth})",
              file=sys.stderr)
    if "*" in config.cors_origins:
        print("warning: --cors-origin '*' lets every web page you open use the model", file=sys.stderr)


def _stop_on_sigterm(stop: threading.Event) -> None:
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())


def _load_engine(args: argparse.Namespace):
    """The engine behind ``serve``: loaded now, unloaded after ``--keep-alive`` without requests."""
    from app.engine import Engine
    from app.engine.keep_alive import ReloadingEngine
    from app.progress import load_progress_bar

    # Given neither --max-batch-size nor --max-context, a small card gets what fits (logged).
    fit = args.max_batch_size is None and args.max_context is None
    batch = DEFAULT_BATCH if args.max_batch_size is None else args.max_batch_size
    options = {} if args.lookup_draft is None else {"lookup_draft": args.lookup_draft}
    loads = []  # --verify hashes the files at the first load, not again at each reload after idle

    def load(progress):
        loads.append(progress)
        engine = Engine.load(args.model_path, model_id=args.model_name, device=args.device, max_batch_size=batch,
                             max_context=args.max_context, vram_budget=args.vram_budget, progress=progress,
                             fit_to_vram=fit, verify=args.verify and len(loads) == 1, **options)
        if args.vram_budget is not None and engine.device == "cpu" and len(loads) == 1:
            print("qwen-tray: note: --vram-budget has no effect here: the model runs on the CPU", file=sys.stderr)
        return engine

    with load_progress_bar(f"loading {args.model_name}") as progress:
        engine = ReloadingEngine(load, keep_alive=args.keep_alive, progress=progress, on_state=_log_state)
    engine.progress = None  # a reload for a request is logged (_log_state), not drawn
    return engine


def _log_state(state: str) -> None:
    messages = {"unloaded": "model unloaded (--keep-alive); the next request loads it again",
                "loading": "loading the model again for a request", "ready": "model loaded"}
    log.info("%s", messages.get(state, state))


def run_serve(args: argparse.Namespace) -> int:
    """Serve until Ctrl+C/SIGTERM; returns the exit status. User errors raise QwenTrayError."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    elif root.level > logging.INFO:  # a server logs what it does (unloads, reloads), as uvicorn does
        root.setLevel(logging.INFO)
    from app.settings.console import locate_model

    # Imported here, not at the top: app/cli.py imports this module to register ``serve`` for
    # every command, and uvicorn, Starlette and the engine are only needed when serving.
    from app.server.server import start_server

    model = locate_model(args.model)
    args.model_path, args.model_name = model.path, model.name
    config = config_from_args(args)
    _warn_exposure(config)
    slot = EngineSlot()
    handle = start_server(slot, config)
    stop = threading.Event()
    _stop_on_sigterm(stop)
    engine = None
    try:
        print(f"Qwen Tray API on {handle.base_url} (loading {args.model_path} ...)", file=sys.stderr)
        try:
            engine = _load_engine(args)
        except QwenTrayError as exc:
            slot.set_error(str(exc))
            raise
        slot.set_ready(engine)
        model_id = config.model_id or engine.model_id
        print(f"ready: model '{model_id}' on {engine.device}; OpenAI base URL {handle.base_url} "
              f"(Ctrl+C to stop)", file=sys.stderr)
        while not stop.wait(0.5):  # a timed wait keeps Ctrl+C deliverable on Windows
            if not handle.running():
                return 1
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        handle.stop()
        if engine is not None:
            engine.close()
