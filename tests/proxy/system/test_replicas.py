"""Replicas of a model against a real `toolsentry serve`: three replica processes
(`replica_upstream`) behind one upstream entry's `base_urls`, a concurrent load of plain and
streamed requests over several sessions, and one replica killed mid-run as a crash would (SIGKILL,
requests in flight on it) and later started again on its port.

What must hold: no client sees an error (another replica could answer each), every session counts
exactly its requests and no error, the load is spread over the replicas, the killed one is cooled
down (its series say so), and it answers again once it is back and its cool-down has ended.
Nothing is asserted about how long anything took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from tests.processes import port_options, reported_port, served_with, stop_process, tail
from tests.proxy.builders import make_request
from tests.proxy.metrics_text import metric

REPO = Path(__file__).resolve().parents[3]
REQUESTS = 240
CONCURRENCY = 12
SESSIONS = 8
KILL_AT = 80  # answers before the replica is killed
DELAY = 0.03  # each replica's wait before it answers: requests are in flight when it dies
COOLDOWN = 1.0
WAIT = 30.0  # the most the test waits for what it expects; it never measures it


class Replica:
    """A `replica_upstream` process named `name`, on a free port or on `port`."""

    def __init__(self, name: str, tmp_path: Path, port: int = 0) -> None:
        self.name = name
        log = tmp_path / f"{name}.log"
        port_file = tmp_path / f"{name}.port"
        command = [sys.executable, "-m", "tests.proxy.system.replica_upstream", "--name", name]
        where = port_options(port_file)
        if port:
            where[1] = str(port)
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [*command, "--delay", str(DELAY), *where], cwd=REPO, stdout=out, stderr=out
            )
        self.port = reported_port(self.process, port_file, tail(log))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        stop_process(self.process, timeout=10)


@contextmanager
def served(tmp_path: Path, urls: list[str]) -> Iterator[str]:
    """A real `toolsentry serve` whose one upstream entry has the replicas at `urls`; its URL."""
    entry = {"name": "replicas", "base_urls": urls, "cooldown_seconds": COOLDOWN}
    with served_with({"upstreams": [entry], "retries": 2}, tmp_path) as (port, _):
        yield f"http://127.0.0.1:{port}"


@dataclass
class Answer:
    """What a client got: the status, and the text of the answer (naming its replica)."""

    status: int
    text: str
    after_kill: bool


async def ask(client: httpx.AsyncClient, proxy: str, index: int) -> tuple[int, str]:
    """Request `index` of the load: its session is `s<index % SESSIONS>`, every third streamed."""
    body = make_request(tools=[]) | {"stream": index % 3 == 0}
    headers = {"x-session-id": f"s{index % SESSIONS}"}
    url = f"{proxy}/v1/chat/completions"
    if not body["stream"]:
        response = await client.post(url, json=body, headers=headers)
        if response.status_code != 200:
            return response.status_code, response.text
        return 200, response.json()["choices"][0]["message"]["content"]
    text, done = "", False
    async with client.stream("POST", url, json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = orjson.loads(line[6:])
                if "error" in event:
                    return 502, line
                text += "".join(c["delta"].get("content") or "" for c in event["choices"])
    return (response.status_code if done else 502), text


async def load(proxy: str, victim: Replica) -> list[Answer]:
    """REQUESTS requests, CONCURRENCY at a time; `victim` killed after KILL_AT answers."""
    gate = asyncio.Semaphore(CONCURRENCY)
    answers: list[Answer] = []

    async def one(client: httpx.AsyncClient, index: int) -> None:
        async with gate:
            try:
                status, text = await ask(client, proxy, index)
            except httpx.TransportError as exc:
                status, text = 0, repr(exc)
            answers.append(Answer(status, text, after_kill=len(answers) >= KILL_AT))
            if len(answers) == KILL_AT:
                victim.kill()

    async with httpx.AsyncClient(timeout=WAIT) as client:
        await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))
    return answers


def replica_metric(page: str, name: str, replica: Replica) -> float:
    return metric(page, name, upstream="replicas", replica=replica.url)


def test_a_replica_killed_under_load_costs_no_client_an_error_and_serves_again_once_back(
    tmp_path: Path,
) -> None:
    replicas = [Replica(f"r{i}", tmp_path) for i in range(3)]
    victim = replicas[1]
    try:
        with served(tmp_path, [r.url for r in replicas]) as proxy:
            answers = asyncio.run(load(proxy, victim))

            failed = [a for a in answers if a.status != 200]
            assert failed == [], f"{len(failed)} clients got an error: {failed[:3]}"
            before = Counter(a.text for a in answers if not a.after_kill)
            for replica in replicas:  # the fewest outstanding: each gets a share
                assert before[f"from {replica.name}"] >= KILL_AT // 6, before
            with httpx.Client(base_url=proxy, timeout=WAIT) as http:
                for session in range(SESSIONS):
                    counts = http.get(f"/v1/sessions/s{session}").json()
                    assert (counts["requests"], counts["errors"]) == (REQUESTS // SESSIONS, 0)
                page = http.get("/metrics").text
            assert replica_metric(page, "toolsentry_replica_cooldowns_total", victim) >= 1
            for replica in replicas:
                assert replica_metric(page, "toolsentry_replica_outstanding", replica) == 0
                if replica is not victim:
                    assert replica_metric(page, "toolsentry_replica_cooldowns_total", replica) == 0

            replicas[1] = victim = Replica(victim.name, tmp_path, port=victim.port)
            assert served_again(proxy, victim), "the replica back was not used again"
    finally:
        for replica in replicas:
            replica.stop()


def served_again(proxy: str, replica: Replica) -> bool:
    """Whether `replica` answers one of the requests sent until it does (or WAIT is over);
    every one of them is answered."""
    deadline = time.monotonic() + WAIT
    with httpx.Client(base_url=proxy, timeout=WAIT) as http:
        while time.monotonic() < deadline:
            response = http.post("/v1/chat/completions", json=make_request(tools=[]))
            assert response.status_code == 200, response.text
            if response.json()["choices"][0]["message"]["content"] == f"from {replica.name}":
                return True
    return False
