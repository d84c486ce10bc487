from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import ConfigError
from proxy.session import open_store
from proxy.session.history import History
from proxy.session.redis_store import RedisStore
from proxy.session.sqlite_store import SqliteStore
from proxy.session.stores import MemoryStore, SessionStore
from tests.proxy.session.conformance import T0, FakeClock, StoreConformance

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def closing() -> AsyncIterator[list[SessionStore]]:
    """Stores put here are closed after the test."""
    stores: list[SessionStore] = []
    yield stores
    for store in stores:
        await store.close()


class TestMemoryStore(StoreConformance):
    @pytest.fixture
    def make_store(self, closing: list[SessionStore]) -> Callable[..., SessionStore]:
        def make(**kwargs: Any) -> SessionStore:
            closing.append(store := MemoryStore(**kwargs))
            return store

        return make


class TestSqliteStore(StoreConformance):
    @pytest.fixture
    def make_store(
        self, closing: list[SessionStore], tmp_path: Path
    ) -> Callable[..., SessionStore]:
        def make(**kwargs: Any) -> SessionStore:
            closing.append(store := SqliteStore(tmp_path / "sessions.db", **kwargs))
            return store

        return make


@pytest.mark.redis
class TestRedisStore(StoreConformance):
    @pytest.fixture
    def make_store(
        self, closing: list[SessionStore], redis_url: str
    ) -> Callable[..., SessionStore]:
        def make(**kwargs: Any) -> SessionStore:
            closing.append(store := RedisStore(redis_url, **kwargs))
            return store

        return make


async def test_memory_store_evicts_the_least_recently_updated_beyond_its_cap() -> None:
    store = MemoryStore(clock=FakeClock(T0 + 3), max_sessions=2)
    await store.record("a", max_errors=10, errors=1, now=T0)
    await store.record("b", max_errors=10, errors=1, now=T0 + 1)
    await store.record("a", max_errors=10, errors=1, now=T0 + 2)
    await store.record("c", max_errors=10, errors=1, now=T0 + 3)
    assert {r.session for r in await store.list()} == {"a", "c"}


async def test_sqlite_counts_survive_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "sessions.db"
    clock = FakeClock()
    first = SqliteStore(path, clock=clock)
    await first.record("s1", max_errors=5, errors=2, channels={"unknown_tool": 2}, now=T0)
    await first.claim_call_ids("s1", ["c1"], now=T0)
    await first.close()

    second = SqliteStore(path, clock=clock)
    try:
        got = await second.record("s1", max_errors=5, errors=1, requests=1, now=T0 + 1)
        assert (got.errors, got.requests, got.channels) == (3, 1, {"unknown_tool": 2})
        assert got.created_at == T0
        assert await second.claim_call_ids("s1", ["c1", "c2"], now=T0 + 1) == ["c2"]
    finally:
        await second.close()


async def test_sqlite_store_purges_expired_rows_from_the_file(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "sessions.db"
    store = SqliteStore(path, ttl_seconds=10, purge_interval_s=0)
    await store.record("old", max_errors=10, channels={"unknown_tool": 1}, now=T0)
    await store.claim_call_ids("old", ["c1"], now=T0)
    await store.record("new", max_errors=10, now=T0 + 20)
    await store.close()

    with sqlite3.connect(path) as db:
        tables = ("sessions", "channels", "claimed_calls")
        remaining = {t: db.execute(f"SELECT session FROM {t}").fetchall() for t in tables}
    db.close()
    assert remaining == {"sessions": [("new",)], "channels": [], "claimed_calls": []}


WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from proxy.session.sqlite_store import SqliteStore

    async def main(path, n):
        store = SqliteStore(path)
        print("ready", flush=True)
        sys.stdin.readline()  # wait for the go, so both processes write at the same time
        for _ in range(n):
            await store.record("shared", max_errors=1000, errors=1, requests=1,
                               channels={"unknown_tool": 1}, now=1_700_000_000.0)
        claimed = await store.claim_call_ids("shared", [f"c{i}" for i in range(50)],
                                             now=1_700_000_000.0)
        print(len(claimed), flush=True)
        await store.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def test_two_processes_opening_one_new_sqlite_file_together_lose_no_updates(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), "100"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for worker in workers:
            assert worker.stdout is not None
            if worker.stdout.readline().strip() != "ready":
                pytest.fail(f"a worker did not open the store: {worker.communicate()[1]}")
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for worker, (_, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err

    claimed_per_process = sorted(int(out.strip()) for out, _ in outputs)
    assert sum(claimed_per_process) == 50

    import asyncio

    async def read() -> Any:
        store = SqliteStore(path, clock=lambda: T0)
        try:
            return await store.get("shared")
        finally:
            await store.close()

    got = asyncio.run(read())
    assert got is not None
    assert (got.errors, got.requests, got.channels) == (200, 200, {"unknown_tool": 200})


def test_open_store_memory_gives_a_memory_store() -> None:
    assert isinstance(open_store("memory"), MemoryStore)


@pytest.mark.parametrize("relative", [False, True])
async def test_open_store_sqlite_url_names_an_absolute_or_relative_file(
    relative: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = "sqlite:///./data/s.db" if relative else f"sqlite://{tmp_path}/data/s.db"
    store = open_store(url, ttl_seconds=60)
    try:
        assert isinstance(store, SqliteStore)
        await store.record("s1", max_errors=10, errors=1, now=T0)
    finally:
        await store.close()
    assert (tmp_path / "data" / "s.db").is_file()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgres://db/sessions", "unknown session store"),
        ("sqlite:///", "names no database file"),
        ("", "unknown session store"),
    ],
)
def test_open_store_refuses_what_it_cannot_open_and_lists_the_valid_forms(
    url: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        open_store(url)
    assert "sqlite:///" in caught.value.message


def test_a_database_path_that_cannot_be_created_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot open session database"):
        SqliteStore(blocker / "sessions.db")


def test_a_non_positive_ttl_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ttl"):
        MemoryStore(ttl_seconds=0)
    with pytest.raises(ConfigError, match="ttl"):
        open_store(f"sqlite://{tmp_path}/s.db", ttl_seconds=-1)


def test_open_store_redis_urls_give_a_redis_store_without_connecting() -> None:
    # Nothing listens on port 9: opening must not connect, only the first operation does.
    for url in ("redis://127.0.0.1:9/0", "rediss://127.0.0.1:9/1"):
        store = open_store(url)
        assert isinstance(store, RedisStore)


def test_a_redis_url_that_cannot_be_parsed_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid session store"):
        open_store("redis://127.0.0.1:notaport/0")


async def test_an_unreachable_redis_is_a_503_store_error_that_hides_the_password(
    refused_port: int,
) -> None:
    from proxy.errors import SessionStoreError, status_of

    store = RedisStore(f"redis://:s3cret@127.0.0.1:{refused_port}/0", socket_timeout_s=1)
    try:
        with pytest.raises(SessionStoreError) as caught:
            await store.record("s1", max_errors=10, errors=1, now=T0)
    finally:
        await store.close()
    assert status_of(caught.value) == 503
    assert caught.value.error_type == "session_store_unavailable"
    assert "s3cret" not in caught.value.message
    assert "127.0.0.1" in caught.value.message


@pytest.mark.redis
async def test_redis_keys_carry_a_ttl_and_expired_sessions_leave_the_indexes(
    redis_url: str,
) -> None:
    import redis.asyncio

    store = RedisStore(redis_url, ttl_seconds=100, clock=FakeClock(T0 + 500))
    raw = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.record("old", max_errors=10, errors=3, now=T0)
        await store.claim_call_ids("old", ["c1"], now=T0)
        assert 0 < await raw.pttl("toolsentry:session:old") <= 100_000
        assert 0 < await raw.pttl("toolsentry:claims:old") <= 100_000
        await store.record("new", max_errors=10, errors=1, now=T0 + 500)
        assert await raw.zrange("toolsentry:sessions:recent", 0, -1) == ["new"]
        failing = await raw.zrange("toolsentry:sessions:failing", 0, -1)
        assert [member.partition("|")[2] for member in failing] == ["new"]
        assert await raw.exists("toolsentry:session:old") == 0
    finally:
        await raw.aclose()
        await store.close()


@pytest.mark.redis
async def test_two_redis_stores_on_one_database_share_counts_and_claims(redis_url: str) -> None:
    import asyncio

    clock = FakeClock()
    first, second = RedisStore(redis_url, clock=clock), RedisStore(redis_url, clock=clock)
    try:
        ids = [f"call_{i}" for i in range(30)]
        writes = [
            store.record("shared", max_errors=10, errors=1, requests=1, now=T0)
            for store in (first, second)
            for _ in range(100)
        ]
        claims = [store.claim_call_ids("shared", ids, now=T0) for store in (first, second)]
        results = await asyncio.gather(*writes, *claims)
        claimed = [call_id for result in results[-2:] for call_id in result]
        assert sorted(claimed) == sorted(ids)
        got = await first.get("shared")
        assert got is not None
        assert (got.errors, got.requests) == (200, 200)
    finally:
        await first.close()
        await second.close()


def history_of(name: str, *prefixes: str) -> History:
    return History(name, prefixes)


async def test_memory_store_remembers_a_bounded_number_of_histories() -> None:
    store = MemoryStore(ttl_seconds=100, clock=FakeClock(T0), max_sessions=2)
    a = await store.track_conversation(history_of("a"), "s-a", now=T0)
    await store.track_conversation(history_of("b"), "s-b", now=T0 + 1)
    await store.track_conversation(history_of("c"), "s-c", now=T0 + 2)  # "a" is forgotten
    assert await store.track_conversation(history_of("a2", "a"), "new", now=T0 + 3) == "new"
    assert a == "s-a"
    # And a history idle for a TTL leaves at the next write.
    await store.track_conversation(history_of("d"), "s-d", now=T0 + 200)
    assert await store.track_conversation(history_of("c2", "c"), "fresh", now=T0 + 200) == "fresh"


async def test_sqlite_store_deletes_expired_histories_from_the_file(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "sessions.db"
    store = SqliteStore(path, ttl_seconds=100, clock=FakeClock(T0))
    try:
        await store.track_conversation(history_of("old"), "s-old", now=T0)
        await store.track_conversation(history_of("new"), "s-new", now=T0 + 150)
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT digest FROM conversations").fetchall() == [("new",)]


@pytest.mark.redis
async def test_redis_histories_carry_the_session_ttl(redis_url: str) -> None:
    import redis.asyncio

    store = RedisStore(redis_url, ttl_seconds=100, clock=FakeClock(T0))
    raw = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.track_conversation(history_of("t1"), "s1", now=T0)
        assert 0 < await raw.pttl("toolsentry:conversation:t1") <= 100_000
        assert await store.track_conversation(history_of("t2", "t1"), "s2", now=T0 + 1) == "s1"
        assert await raw.exists("toolsentry:conversation:t1") == 0  # emptied, so gone
        assert 0 < await raw.pttl("toolsentry:conversation:t2") <= 100_000
    finally:
        await raw.aclose()
        await store.close()
