"""Run several ``qwen-tray`` commands in one interpreter (one start, one torch import) and print
each one's exit status, stdout and stderr as JSON. An exception escaping main() is printed as
its traceback on that command's stderr: the caller's one-line-error checks then fail."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback

from app.cli import main


def run_all(commands: list[list[str]]) -> list[dict]:
    results = []
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except BaseException:  # noqa: BLE001 - reported, not hidden
                traceback.print_exc()
                code = 99
        results.append({"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
    return results


if __name__ == "__main__":
    sys.stdin = io.StringIO("")
    print(json.dumps(run_all(json.loads(sys.argv[1]))))
