"""The ``qwen-tray`` command line.

``qwen-tray`` alone starts the tray app (or hands its arguments to the running one); subcommands:
tray, action, ask, models, doctor, serve, quantize, checkpoint. A user error (QwenTrayError) prints one line and exits 1; no traceback.
A parameter the engine refuses is named by the option the user typed (``--top-p``), not by the
engine's field (``top_p``), which the server keeps for its OpenAI-style messages.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from app import __version__
from app.commands.console_streams import prepare_streams
from app.commands.text_input import is_terminal
from app.errors import InvalidParameterError, QwenTrayError
from app.settings.preferences import LANGUAGES, language_option


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwen-tray", description="A local assistant for Qwen2.5 / Llama models "
                                     "(with no subcommand: start the tray app).")
    parser.add_argument("--version", action="version", version=f"qwen-tray {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    # (also after the subcommand: every subcommand's parser is a SubcommandParser)
    # The tray's own options work without "tray" too: `qwen-tray --language zh_CN`.
    parser.add_argument("--language", choices=LANGUAGES, type=language_option,
                        help="UI language of the tray app for this run (zh is zh_CN)")
    parser.add_argument("--replace", dest="tray_replace", action="store_true",
                        help="quit the running tray app and start this one")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SubcommandParser)

    from app.commands import action, ask, doctor, models, tray

    tray.register(sub)
    action.register(sub)
    ask.register(sub)
    models.register(sub)
    doctor.register(sub)
    for module in ("app.server.cli", "app.quant.cli", "app.quant.recipe_cli", "app.quant.checkpoint_cli"):
        _register_optional(sub, module)
    return parser


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: ``-v`` after the subcommand too (``qwen-tray ask -v ...``,
    ``qwen-tray models list -v``), as before it. Its own subcommands are of this class too
    (argparse's default ``parser_class`` is the parent's). SUPPRESS: a subcommand given no
    ``-v`` leaves the value given before it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                          help="log what the engine does")


def _register_optional(sub, module_name: str) -> None:
    """Subcommands owned by other packages (server, quantizer) plug in when present."""
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            return
        raise
    module.register(sub)


def _check_tray_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--language and --replace belong to the tray app: another command would silently ignore them."""
    if args.command in (None, "tray"):
        return
    given = [flag for flag, value in (("--language", args.language), ("--replace", args.tray_replace)) if value]
    if given:
        parser.error(f"{' and '.join(given)} {'is an option' if len(given) == 1 else 'are options'} of the tray app "
                     f"(qwen-tray {given[0]} ...), not of `{args.command}`")


def main(argv: list[str] | None = None) -> int:
    args = None
    prepare_streams()  # pythonw's missing streams, a code page that lacks a character (console_streams)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)  # (some option types import torch: Ctrl+C may come here)
        _check_tray_options(parser, args)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s")
        if args.command is None:
            from app.commands import tray

            return tray.run(args)
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught below, not at exit
        return status
    except InvalidParameterError as e:
        print(f"qwen-tray: error: {option_message(e, args)}", file=sys.stderr)
        return 1
    except QwenTrayError as e:
        print(f"qwen-tray: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # an Interrupted says what was kept (errors.Interrupted)
        if is_terminal(sys.stderr):
            print(file=sys.stderr)  # end the line the terminal echoed ^C on
        if str(e):
            print(f"qwen-tray: {e}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `qwen-tray ... | head`: the reader has what it wanted
        # Python flushes stdout at exit and would fail again there (docs: "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def option_message(error: InvalidParameterError, args: argparse.Namespace | None) -> str:
    """``error`` naming the command's option (argparse's dest ``top_p`` is the option ``--top-p``)."""
    if args is None or error.param not in vars(args):
        return str(error)  # not one of this command's options: the engine's own words
    return f"--{error.param.replace('_', '-')}: {error.reason}"


if __name__ == "__main__":
    sys.exit(main())
