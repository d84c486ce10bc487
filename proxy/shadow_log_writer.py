"""The shadow log's writer (DESIGN §11): JSONL, one line per shadow event, written by a thread of
its own and rotated by size. Its reader is `evalkit.shadowlog` (`evalkit shadow`)."""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final

import orjson

from proxy.errors import ConfigError

_LOG_QUEUE: Final = 10_000
_LOG_POLL_SECONDS: Final = 0.05


class ShadowLog:
    """The shadow log: JSONL, one line per event, written by a thread of its own so the event
    loop never waits on the disk; rotated by size into `path.1`, `path.2`, … (with no backups
    the file is emptied instead). The loop only encodes a line and appends it to a queue; the
    writer takes what has gathered every `_LOG_POLL_SECONDS` and writes it in one call. A full
    queue (a disk that cannot keep up) or a failed write loses the lines and counts them (`lost`).
    """

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file: BinaryIO | None = path.open("ab")
            self._size = self._file.seek(0, os.SEEK_END)
        except OSError as exc:
            raise ConfigError(f"cannot open shadow log {str(path)!r}: {exc}") from exc
        self.path = path
        self._max_bytes = max_bytes
        self._backups = backups
        self._lines: collections.deque[bytes] = collections.deque()
        self._full = 0  # counted by the event loop
        self._failed = 0  # counted by the writer
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="shadow-log", daemon=True)
        self._writer.start()

    @property
    def lost(self) -> int:
        """Lines not written: the queue was full, or the disk refused them."""
        return self._full + self._failed

    def write(self, line: Mapping[str, Any]) -> None:
        """Queue one line; never blocks."""
        if len(self._lines) >= _LOG_QUEUE:
            self._full += 1
            return
        self._lines.append(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))

    def close(self) -> None:
        """Write what is queued and close the file."""
        self._stop.set()
        self._writer.join()
        self._write_queued()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write_loop(self) -> None:
        while not self._stop.wait(_LOG_POLL_SECONDS):
            self._write_queued()

    def _write_queued(self) -> None:
        lines, chunk, size = self._lines, list[bytes](), 0
        taken = 0  # lines off the queue and not yet written
        try:
            while lines:
                line = lines.popleft()
                taken += 1
                file = self._file or self._reopen()
                if self._size + size + len(line) > self._max_bytes and self._size + size > 0:
                    file.write(b"".join(chunk))
                    taken -= len(chunk)
                    chunk.clear()
                    size = 0
                    self._rotate(file)
                chunk.append(line)
                size += len(line)
            if chunk:
                file = self._file or self._reopen()
                file.write(b"".join(chunk))
                file.flush()
                self._size += size
        except OSError:  # what was taken is lost; the next batch tries a fresh file
            self._failed += taken
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
            self._file = None

    def _reopen(self) -> BinaryIO:
        self._file = file = self.path.open("ab")
        self._size = file.seek(0, os.SEEK_END)
        return file

    def _rotate(self, file: BinaryIO) -> None:
        file.close()
        self._file = None
        if self._backups > 0:
            for i in range(self._backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
            self._reopen()
        else:
            self._file = self.path.open("wb")
        self._size = 0
