"""The shadow log's writer: JSONL rotated by size, every line whole."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.shadow_log_writer import ShadowLog


def write_log(path: Path, *, backups: int, lines: int = 200) -> ShadowLog:
    """A 2 KiB shadow log at `path` given `lines` numbered lines (field `i`), then closed."""
    log = ShadowLog(path, max_bytes=2048, backups=backups)
    for i in range(lines):
        log.write({"event": "pair", "i": i, "pad": "x" * 40})
    log.close()
    return log


def test_the_log_is_rotated_by_size_and_every_line_is_whole_json(tmp_path: Path) -> None:
    path = tmp_path / "shadow.jsonl"
    write_log(path, backups=2)
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["shadow.jsonl", "shadow.jsonl.1", "shadow.jsonl.2"]
    for f in files:
        assert f.stat().st_size <= 2048
        for line in f.read_text().splitlines():
            assert orjson.loads(line)["event"] == "pair"
    newest = [orjson.loads(x)["i"] for x in path.read_text().splitlines()]
    assert newest[-1] == 199


def test_a_log_without_backups_is_emptied_at_its_size(tmp_path: Path) -> None:
    path = tmp_path / "shadow.jsonl"
    log = write_log(path, backups=0)
    assert [f.name for f in tmp_path.iterdir()] == ["shadow.jsonl"]
    assert path.stat().st_size <= 2048
    newest = [orjson.loads(x)["i"] for x in path.read_text().splitlines()]
    assert newest == list(range(newest[0], 200))  # the newest lines, whole and in order
    assert log.lost == 0
