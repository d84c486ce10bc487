"""The child processes the tests start (servers, the proxy): where they listen, and ending them,
also when they hang."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import yaml

REPO = Path(__file__).resolve().parents[1]


class ServerNotStarted(RuntimeError):
    """A server child process exited, or did not report its port in time; the message has its
    log."""


def port_options(port_file: Path) -> list[str]:
    """The options that make `toolsentry serve` or `evalkit sim serve` listen on a free port and
    report it in `port_file` (see `reported_port`)."""
    port_file.unlink(missing_ok=True)  # a file left by an earlier server is not this one's
    return ["--port", "0", "--port-file", str(port_file)]


def reported_port(
    process: subprocess.Popen[Any],
    port_file: Path,
    log: Callable[[], str],
    *,
    timeout: float = 120,
) -> int:
    """The port `process` (started with `port_options(port_file)`) listens on: it writes the file
    once its socket listens, so a connection made from then on is never refused. Raises
    ServerNotStarted, with `log()`, when it exits first or writes nothing within `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = port_file.read_text()
        except FileNotFoundError:
            text = ""
        if text.endswith("\n"):  # written whole (renamed into place)
            return int(text)
        if process.poll() is not None:
            raise ServerNotStarted(
                f"{process.args!r} exited with {process.returncode} before it listened:\n{log()}"
            )
        if time.monotonic() > deadline:
            raise ServerNotStarted(f"{process.args!r} did not listen within {timeout} s:\n{log()}")
        time.sleep(0.05)


def tail(path: Path, size: int = 3000) -> Callable[[], str]:
    """A `log` for `reported_port`: the end of the file `path`."""
    return lambda: path.read_text(errors="replace")[-size:] if path.exists() else ""


def stop_process(process: subprocess.Popen[Any], timeout: float) -> None:
    """Terminate `process` (when still running) and wait up to `timeout` seconds for it to end,
    then kill it. Its pipes are read to the end, so a full pipe cannot keep it alive."""
    process.terminate()
    try:
        process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()


class OutputLines:
    """A child's text pipe read line by line in a thread, so that a test can wait for a line the
    child prints at a point it reached (a finished episode, a kept answer) and act then, and still
    have the whole output once the child ends."""

    def __init__(self, pipe: IO[str] | None) -> None:
        assert pipe is not None, "the child's output goes to a pipe (subprocess.PIPE)"
        self.lines: list[str] = []
        self._landed: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._reader.start()

    def _read(self, pipe: IO[str]) -> None:
        with pipe:  # closed at its end, as `communicate` would
            for line in pipe:
                self.lines.append(line)
                self._landed.put(line)
        self._landed.put(None)  # the end of the output

    def wait_for(self, pattern: str, *, timeout: float = 300) -> str:
        """The first line from here on that `re.search(pattern, line)` finds. Raises
        AssertionError with the output so far when the output ends first, or after `timeout` s
        (a safety net against a child that hangs, not a measure of its speed)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._landed.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} within {timeout} s:\n{self.text()}"
                ) from None
            if line is None:
                raise AssertionError(
                    f"the output ended with no line matching {pattern!r}:\n{self.text()}"
                )
            if re.search(pattern, line):
                return line

    def text(self) -> str:
        """The output read so far."""
        return "".join(self.lines)

    def whole(self, timeout: float = 60) -> str:
        """The whole output, once the pipe is closed (the child ended)."""
        self._reader.join(timeout)
        return self.text()


@contextmanager
def served_with(settings: dict[str, Any], directory: Path) -> Iterator[tuple[int, int]]:
    """A real `toolsentry serve` reading `settings` from a YAML file in `directory` (its log
    there too), on a free port: its port and pid. Stopped on leaving."""
    config = directory / "toolsentry.yaml"
    config.write_text(yaml.safe_dump(settings))
    log, port_file = directory / "serve.log", directory / "serve.port"
    command = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*command, *port_options(port_file)], cwd=REPO, stdout=out, stderr=out
        )
    try:
        yield reported_port(process, port_file, tail(log)), process.pid
    finally:
        stop_process(process, timeout=10)
