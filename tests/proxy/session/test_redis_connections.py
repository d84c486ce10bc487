from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.session.redis_connections import (
    Connections,
    Script,
    command,
    lua_string,
    pack,
    pack_bytes,
)
from tests.conftest import RedisServer

# A command's name, then any arguments (redis-py splits a name at spaces: "SCRIPT LOAD").
parts = st.tuples(
    st.sampled_from(["EVALSHA", "GET", "SET", "HGETALL", "ZREVRANGE"]),
    st.lists(st.one_of(st.text(), st.binary()), max_size=8),
).map(lambda named: [named[0], *named[1]])

# Runs about `ARGV[1]` seconds on the server, then returns ARGV[2].
_BUSY = """
local started = redis.call('TIME')
local function elapsed()
  local t = redis.call('TIME')
  return (t[1] - started[1]) + (t[2] - started[2]) / 1e6
end
while elapsed() < tonumber(ARGV[1]) do end
return ARGV[2]
"""


@given(parts)
def test_pack_writes_what_redis_py_writes(given_parts: list[str | bytes]) -> None:
    assert pack(given_parts) == b"".join(Connection().pack_command(*given_parts))


def test_a_part_longer_than_the_table_of_bulk_heads_packs_as_redis_py_packs_it() -> None:
    parts = ["EVALSHA", "x" * 1023, "y" * 1024, "z" * 5000]
    assert pack(parts) == b"".join(Connection().pack_command(*parts))
    script = Script("return 1")
    assert script.packed(parts[1:2], parts[2:]) == pack(
        ("EVALSHA", script.sha, "1", *parts[1:2], *parts[2:])
    )


@given(st.lists(st.one_of(st.text(), st.text(alphabet="abc:{}|0123456789 .-")), max_size=10))
def test_the_ascii_fast_path_packs_as_part_by_part_packing(texts: list[str]) -> None:
    assert pack(["GET", *texts]) == pack_bytes(["GET", *texts])


@given(st.lists(st.text(), max_size=4), st.lists(st.text(), max_size=6))
def test_a_scripts_packed_call_is_evalsha_of_its_sha_keys_and_args(
    keys: list[str], args: list[str]
) -> None:
    script = Script("return 1")
    assert script.packed(keys, args) == pack(("EVALSHA", script.sha, str(len(keys)), *keys, *args))


@pytest.fixture
async def connect(redis_url: str) -> AsyncIterator[Callable[..., Connections]]:
    made: list[Connections] = []

    def make(timeout_s: float = 5.0) -> Connections:
        made.append(connections := Connections(redis_url, timeout_s))
        return connections

    yield make
    for connections in made:
        await connections.close()


@pytest.mark.redis
async def test_a_lua_string_literal_holds_any_text(connect: Callable[..., Connections]) -> None:
    connections = connect()
    for text in ("", "toolsentry:", '"', "\\", "]]", "\n\r\x00", "é{tag}", "' .. x .. '"):
        got = await connections.call(command("EVAL", f"return {lua_string(text)}", "0"))
        assert got == text


@pytest.mark.redis
async def test_a_script_the_server_forgot_is_loaded_again(
    connect: Callable[..., Connections], redis_server: RedisServer
) -> None:
    connections = connect()
    script = Script("return ARGV[1]")
    assert await connections.run(script, (), ("first",)) == "first"
    assert redis_server.command("SCRIPT", "FLUSH").startswith(b"+OK")
    assert await connections.run(script, (), ("again",)) == "again"


@pytest.mark.redis
async def test_an_idle_connection_the_server_closed_is_replaced(
    connect: Callable[..., Connections], redis_server: RedisServer
) -> None:
    connections = connect()
    assert await connections.call(command("SET", "k", "v")) == "OK"
    assert redis_server.command("CLIENT", "KILL", "TYPE", "normal").startswith(b":")
    assert await connections.call(command("GET", "k")) == "v"


@pytest.mark.redis
async def test_a_call_cancelled_before_its_reply_leaves_none_for_the_next(
    connect: Callable[..., Connections],
) -> None:
    connections = connect()
    busy = Script(_BUSY)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(connections.run(busy, (), ("0.3", "late")), 0.05)
    assert await connections.call(command("ECHO", "mine")) == "mine"


@pytest.mark.redis
async def test_a_reply_later_than_the_timeout_is_a_redis_timeout(
    connect: Callable[..., Connections],
) -> None:
    connections = connect(timeout_s=0.05)
    with pytest.raises(RedisTimeoutError):
        await connections.run(Script(_BUSY), (), ("0.3", "late"))
    await asyncio.sleep(0.3)  # the server finishes the script before the next command
    assert await connections.call(command("ECHO", "mine")) == "mine"


@pytest.mark.redis
async def test_pipelined_commands_answer_in_order_and_an_error_reply_is_raised(
    connect: Callable[..., Connections],
) -> None:
    connections = connect()
    replies = await connections.call_many([command("SET", "n", "1"), command("INCR", "n")])
    assert replies == ["OK", 2]
    with pytest.raises(ResponseError):
        await connections.call_many([command("INCR", "n"), command("HGET", "n", "f")])
    assert await connections.call(command("GET", "n")) == "3"  # the connection is still fine


@pytest.mark.redis
async def test_concurrent_calls_share_one_connection_and_each_gets_its_own_reply(
    connect: Callable[..., Connections], redis_server: RedisServer
) -> None:
    connections = connect()
    await connections.call(command("PING"))
    before = redis_server.command("INFO", "stats")
    replies = await asyncio.gather(*(connections.call(command("ECHO", str(i))) for i in range(50)))
    assert replies == [str(i) for i in range(50)]
    clients = redis_server.command("CLIENT", "LIST").decode().count("cmd=")
    assert clients == 2  # the connections' one, and the one asking
    assert reads(redis_server.command("INFO", "stats")) - reads(before) < 50  # batched


def reads(info: bytes) -> int:
    line = next(x for x in info.decode().splitlines() if x.startswith("total_reads_processed:"))
    return int(line.partition(":")[2])


@pytest.mark.redis
async def test_a_cancelled_call_among_concurrent_ones_leaves_the_others_their_replies(
    connect: Callable[..., Connections],
) -> None:
    connections = connect()
    busy = Script(_BUSY)
    slow = asyncio.ensure_future(connections.run(busy, (), ("0.2", "slow")))
    others = [asyncio.ensure_future(connections.call(command("ECHO", str(i)))) for i in range(5)]
    await asyncio.sleep(0.05)
    slow.cancel()
    assert await asyncio.gather(*others) == [str(i) for i in range(5)]
    assert await connections.call(command("ECHO", "after")) == "after"


@pytest.mark.redis
async def test_a_redis_py_without_the_connections_stream_is_said_not_an_attribute_error(
    connect: Callable[..., Connections], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipe takes over the stream redis-py's connection keeps in a private attribute; a
    redis-py that keeps none fails the call with a redis ConnectionError that says so."""

    async def connected_without_a_stream(self: Connection) -> None:
        return None  # `_writer` stays None, as a redis-py that keeps no such stream leaves it

    monkeypatch.setattr(Connection, "connect", connected_without_a_stream)
    with pytest.raises(RedisConnectionError, match=r"Connection\._writer"):
        await connect().call(command("GET", "k"))
