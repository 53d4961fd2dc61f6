"""Helper processes of the tray tests (ui_x11_driver.py, ui_x11_target.py, `qwen-tray` itself)
speaking JSON lines on stdout."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).parent
TIMEOUT = 60  # generous: the machine is shared; nothing here measures speed


class Child:
    """A helper process speaking JSON lines on stdout; ``seen`` keeps every event it sent."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen([sys.executable, *args], cwd=HERE, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                self.seen.append(event)
                self.events.put(event)

    def wait_for(self, name: str) -> dict:
        while True:
            try:
                event = self.events.get(timeout=TIMEOUT)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {name!r} event; stderr:\n{self.proc.stderr.read()[-3000:]}") from None
            if event["event"] in ("load_failed",):
                raise AssertionError(f"model failed to load: {event}")
            if event["event"] == name:
                return event

    def drain(self) -> None:
        while not self.events.empty():
            self.events.get_nowait()

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def command(self, line: str) -> None:
        """A target command, answered with "ok" once it is done."""
        self.send(line)
        self.wait_for("ok")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
