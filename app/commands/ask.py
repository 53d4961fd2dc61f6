"""``qwen-tray ask``: one question, the answer streamed to stdout."""

from __future__ import annotations

import argparse
import os
import sys
from urllib.parse import urlsplit, urlunsplit

from app.commands import text_input
from app.commands.text_input import is_terminal
from app.commands.arguments import memory_size, note_unused_vram_budget
from app.errors import ContextLengthError, Interrupted, QwenTrayError


def register(sub) -> None:
    p = sub.add_parser("ask", help="ask the model one question and stream the answer",
                       description="Ask the model one question; the answer streams to standard output.")
    p.add_argument("prompt", nargs="+", metavar="PROMPT",
                   help="the question; several words are joined with spaces, so quotes are optional "
                        "(qwen-tray ask What is RoPE?); '-' reads it from standard input")
    p.add_argument("--model", metavar="NAME|PATH",
                   help="registered model name or model folder (default: the configured default)")
    p.add_argument("--adapter", metavar="DIR", help="a PEFT LoRA adapter folder (adapter_config.json + "
                   "adapter_model.safetensors) to merge at load")
    p.add_argument("--server", metavar="URL", help="ask a running qwen-tray/OpenAI-compatible server instead")
    p.add_argument("--api-key", metavar="KEY", help="API key for --server")
    p.add_argument("--system", metavar="TEXT", help="a system message")
    p.add_argument("--max-tokens", type=int, default=512, metavar="N", help="most tokens to generate (default 512)")
    p.add_argument("--temperature", type=float, default=0.7, metavar="T", help="0 = greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.9, metavar="P", help="nucleus sampling (default 0.9)")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the K likeliest tokens (0 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="above 1 makes tokens already in the text less likely (default 1: off)")
    p.add_argument("--seed", type=int, metavar="S", help="same seed, same answer")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--max-context", type=int, metavar="N",
                   help="tokens per request (default: model max, at most 4096, or what fits the GPU)")
    p.add_argument("--vram-budget", type=memory_size, metavar="SIZE",
                   help="GPU memory the model may use, e.g. 3.2GiB (default: what is free minus a margin)")
    p.add_argument("--verify", action="store_true",
                   help="hash every file of a quantized checkpoint against its manifest, even those "
                        "verified before and unchanged since (default: only files changed since)")
    p.set_defaults(func=run)


def read_prompt(words: list[str]) -> str:
    """The prompt from its words (as `ollama run` and `llm` take them), or standard input for '-'."""
    if words[0] == "-" and len(words) > 1:  # `echo text | ask - summarize` would send "- summarize"
        raise QwenTrayError("'-' reads the prompt from standard input and takes no other words; "
                            "put the instruction in the input, or use --system for it")
    text = text_input.from_stdin() if words == ["-"] else text_input.from_argument(" ".join(words))
    if not text.strip():
        raise QwenTrayError("the prompt is empty")
    return text


def run(args: argparse.Namespace) -> int:
    from app.engine.params import SamplingParams

    prompt = read_prompt(args.prompt)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": prompt}]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, repetition_penalty=args.repetition_penalty, seed=args.seed,
                            stop=tuple(args.stop))
    if args.server:
        return _ask_server(args, messages, params)
    return _ask_local(args, messages, params)


def _ask_local(args, messages, params) -> int:
    from app.engine import Engine
    from app.progress import load_progress_bar
    from app.settings.console import locate_model

    model = locate_model(args.model)
    with load_progress_bar(f"loading {model.name}") as progress:
        # Without --max-context the context is the default's or, on a small card, what fits.
        engine = Engine.load(model.path, model_id=model.name, device=args.device, max_batch_size=1,
                             max_context=args.max_context, adapter=args.adapter, progress=progress,
                             vram_budget=args.vram_budget, fit_to_vram=args.max_context is None, verify=args.verify)
    with engine:
        note_unused_vram_budget(args.vram_budget, engine.device)
        try:
            generation = engine.chat(messages, params)
        except ContextLengthError as e:
            raise QwenTrayError(prompt_too_long(e.requested, engine.max_context, engine.spec.max_position_embeddings,
                                                given=args.max_context is not None, answer=params.max_tokens)) from None
        try:
            _stream(generation)
        except KeyboardInterrupt:
            generation.cancel()
            raise
        note = cut_short(generation.result, params.max_tokens, engine.max_context)
        if note:
            print(f"qwen-tray: {note}", file=sys.stderr)
    return 0


def prompt_too_long(needed: int, context: int, model_max: int, *, given: bool, answer: int) -> str:
    """The prompt (as the chat template wraps it) leaves no token of the context for the answer;
    the context suggested holds the prompt and an answer of ``answer`` tokens (--max-tokens)."""
    limit = f"--max-context is {context}" if given else f"the context is {context} tokens"
    fix = (f"give --max-context {min(needed + answer, model_max)} or more, or shorten the prompt" if needed < model_max
           else f"shorten the prompt (this model reads at most {model_max} tokens)")
    return f"the prompt needs {needed} tokens with the chat template but {limit}; {fix}"


def cut_short(result, max_tokens: int, context: int | None) -> str | None:
    """Why an answer ended before the model finished it (said on stderr: stdout holds the answer only).
    ``context``: the model's context in tokens, None where a server decides it."""
    if result.finish_reason != "length":
        return None
    if result.usage.completion_tokens >= max_tokens:
        return f"the answer stopped at --max-tokens {max_tokens}; give a larger --max-tokens for more"
    if context is None:
        return "the answer stopped when the server's context was full; shorten the prompt"
    return (f"the answer stopped when the context of {context} tokens was full; "
            "give a larger --max-context or shorten the prompt")


SERVER_READ_TIMEOUT_S = 600.0  # a busy server may queue the request for minutes before its first token


def server_base_url(url: str) -> str:
    """--server as an API base URL: http:// when no scheme is given, /v1 appended when missing
    (so the address `serve` prints works with or without it)."""
    from app.remote import is_http_url

    with_scheme = url if "://" in url else f"http://{url}"
    if not is_http_url(with_scheme):
        raise QwenTrayError(f"--server {url!r}: expected a URL like http://127.0.0.1:18000/v1")
    parts = urlsplit(with_scheme)
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path if path.endswith("/v1") else path + "/v1", "", ""))


def _ask_server(args, messages, params) -> int:
    """Through the client the tray uses for remote models (app/remote: the openai SDK)."""
    from app.remote import DIRECT, FixHints, RemoteClient
    from app.server.config import API_KEY_ENV, is_loopback_host

    base_url = server_base_url(args.server)
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV, "")
    # A server on this machine is never asked through a proxy: the proxy's loopback is its own.
    proxy = DIRECT if is_loopback_host(urlsplit(base_url).hostname or "") else ""
    hints = FixHints(api_key=f"give the server's key with --api-key or ${API_KEY_ENV}",
                     model="check --model, or leave it out for the first model the server lists")
    with RemoteClient(base_url, api_key, timeout_s=SERVER_READ_TIMEOUT_S, proxy=proxy, hints=hints) as client:
        stream = client.chat(args.model or client.first_model(), messages, params)
        _stream(stream)
    note = cut_short(stream.result, params.max_tokens, None)
    if note:
        print(f"qwen-tray: {note}", file=sys.stderr)
    return 0


def _stream(deltas) -> None:
    """Write the answer as it comes. Ctrl+C ends its line and says on stderr that it was cut short
    (exit 130): a file or pipe gets a whole last line; on a terminal the CLI ends the line after
    the ^C the terminal echoed."""
    try:
        for delta in deltas:
            sys.stdout.write(delta)
            sys.stdout.flush()
    except KeyboardInterrupt:
        if not (is_terminal(sys.stdout) and is_terminal(sys.stderr)):
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise Interrupted("stopped: the answer was cut short (Ctrl+C)") from None
    sys.stdout.write("\n")
    sys.stdout.flush()

