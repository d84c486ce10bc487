"""How many episodes per second does `evalkit replay` play, and how much of that is the proxy?

`evalkit replay` without `--base-url` starts the simulated upstream and the proxy in its own
process (uvicorn on loopback threads) and plays episodes against them with the scripted user.
This script does the same through the project's API — `Replay.start`, then `Replay.run`, the loop
`evalkit replay` runs — and times only that loop, for three targets side by side:

- `proxy`         the agent → the proxy → the simulated upstream, repair off (`int4` arm);
- `proxy+repair`  the same with the proxy's repair by re-ask on (`int4+repair` arm);
- `direct`        the agent → the simulated upstream, no proxy (the same `int4` episodes: with
                  repair off the proxy passes every answer on as it came, so the agent sees the
                  same turns; the model-call counts in the table show whether they matched).

Each at concurrency 1, 4 and 8 (episodes at a time), for the retail and the telecom domain, on
the first N tasks of each, profile `int4`, in rounds whose target order rotates; medians over
rounds are shown, ratios against `direct` of the same round are the headline. The servers start
once per domain and are warmed up before timing; start-up is not timed. The proxy logs at error
level into memory, as `evalkit replay` configures it.

Everything shares one process and its GIL, as in `evalkit replay`: agent, user, proxy and
simulated upstream together use at most one core, so the rates follow the CPU the process gets.
Beside the wall-clock rates the table gives the process's CPU time (all threads) per agent call
and episodes per CPU-second, the steadier figures on a shared machine; the proxy's share of an
agent call is 1 − direct ÷ proxy of those per-call times.

    python -m bench.evalkit [--tasks 12] [--trials 1] [--rounds 3] [--concurrency 1,4,8]
                            [--only retail,proxy] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.machine import cpu_seconds, load_average, machine
from bench.tables import markdown_table, rich_table, write_section
from evalkit.domains import get_domain
from evalkit.domains.base import Domain
from evalkit.replay import Replay, ReplayOptions, reward_of
from evalkit.scoring import is_success
from evalkit.sim.profiles import load_profile
from evalkit.sim.server import create_sim_app
from proxy.app import create_app
from proxy.config import Settings
from proxy.config_upstream import UpstreamConfig
from proxy.logs import configure_logging
from proxy.testing import LoopbackServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION_BEGIN = "<!-- evalkit.py:begin -->"
SECTION_END = "<!-- evalkit.py:end -->"
DOMAINS = ("retail", "telecom")
TARGETS = ("direct", "proxy", "proxy+repair")
REPAIR = {"direct": "off", "proxy": "off", "proxy+repair": "reask"}
PROFILE = "int4"
CHAT_PATH = "/v1/chat/completions"
WARMUP_TASKS = 3

console = Console(width=None if sys.stdout.isatty() else 150)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class CountingApp:
    """An ASGI app that counts the chat completions it is asked for, then serves `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.chats = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CHAT_PATH:
            self.chats += 1
        await self.app(scope, receive, send)


@dataclass
class Servers:
    """The simulated upstream and a proxy in front of it, with their request counters."""

    sim: CountingApp
    proxy: CountingApp
    sim_url: str
    proxy_url: str

    def base_url(self, target: str) -> str:
        return self.sim_url if target == "direct" else self.proxy_url


@contextlib.contextmanager
def servers(domain: Domain, max_errors: int, seed: int) -> Iterator[Servers]:
    """Start what `evalkit.replay.embedded_upstream` starts, with counters on both apps."""
    profile = load_profile(PROFILE)
    sim_app = CountingApp(
        create_sim_app(domain, {profile.name: profile}, default_profile=profile.name, seed=seed)
    )
    with LoopbackServer(sim_app) as sim:
        settings = Settings(
            upstreams=[UpstreamConfig(name="evalkit-sim", base_url=f"{sim.url}/v1")],
            max_errors=max_errors,
            allow_overrides=True,
        )
        proxy_app = CountingApp(create_app(settings))
        with LoopbackServer(proxy_app) as proxy:
            yield Servers(sim_app, proxy_app, f"{sim.url}/v1", f"{proxy.url}/v1")


# -- measurements ---------------------------------------------------------------------------------


@dataclass
class Sample:
    """One timed replay: a target at a concurrency, every selected task × trial once."""

    seconds: float
    episodes: int
    agent_calls: int  # chat completions the agent asked for
    upstream_calls: int  # chat completions the simulated upstream answered (re-asks included)
    passed: int
    episode_seconds: list[float]
    cpu_seconds: float  # of the whole process: agent, user, proxy and simulated upstream

    @property
    def per_second(self) -> float:
        return self.episodes / self.seconds

    @property
    def seconds_per_call(self) -> float:
        return self.seconds / max(1, self.agent_calls)

    @property
    def per_cpu_second(self) -> float:
        return self.episodes / self.cpu_seconds

    @property
    def cpu_per_call(self) -> float:
        return self.cpu_seconds / max(1, self.agent_calls)


@dataclass
class Cell:
    """Every round's sample of one (domain, target, concurrency)."""

    domain: str
    target: str
    concurrency: int
    samples: list[Sample] = field(default_factory=list)

    def median(self, value: Callable[[Sample], float]) -> float:
        return statistics.median(value(s) for s in self.samples)


def replay_options(
    args: argparse.Namespace, domain: str, target: str, concurrency: int, tasks: list[str]
) -> ReplayOptions:
    """The options `evalkit replay --profile int4 --repair R --tasks … --concurrency C` builds."""
    return ReplayOptions(
        domain=domain,
        profiles=(PROFILE,),
        repairs=(REPAIR[target],),
        tasks=",".join(tasks),
        trials=args.trials,
        concurrency=concurrency,
        seed=args.seed,
        max_errors=args.max_errors,
    )


async def play(replay: Replay, base_url: str) -> tuple[float, float]:
    """Run the replay's episode loop against `base_url`; its wall-clock and CPU seconds."""
    cpu, started = cpu_seconds(), time.perf_counter()
    await replay.run(base_url)
    return time.perf_counter() - started, cpu_seconds() - cpu


def measure_once(options: ReplayOptions, running: Servers, target: str, workdir: Path) -> Sample:
    """One replay of `options` against `target`, timed around `Replay.run` only."""
    replay = Replay.start(options, Path(tempfile.mkdtemp(dir=workdir)))
    sim_before, proxy_before = running.sim.chats, running.proxy.chats
    seconds, cpu = asyncio.run(play(replay, running.base_url(target)))
    simulations = [s for run in replay.runs.values() for s in run.simulations]
    upstream = running.sim.chats - sim_before
    agent = upstream if target == "direct" else running.proxy.chats - proxy_before
    return Sample(
        seconds=seconds,
        episodes=len(simulations),
        agent_calls=agent,
        upstream_calls=upstream,
        passed=sum(1 for s in simulations if is_success(reward_of(s))),
        episode_seconds=[s.duration or 0.0 for s in simulations],
        cpu_seconds=cpu,
    )


Key = tuple[str, str, int]  # domain, target, concurrency


def measure(args: argparse.Namespace) -> tuple[dict[Key, Cell], dict[str, Any]]:
    """Every cell, round by round with the target order rotating; plus facts about the run."""
    cells: dict[Key, Cell] = {}
    info: dict[str, Any] = {"load": load_average(), "tasks": {}}
    # As `evalkit replay` does: the in-process proxy logs only errors, into memory.
    configure_logging("error", stream=io.StringIO())
    targets: list[str] = args.targets
    with tempfile.TemporaryDirectory(prefix="bench-evalkit-") as tmp:
        workdir = Path(tmp)
        for name in args.domains:
            domain = get_domain(name)
            ids = [t.id for t in domain.tasks[: args.tasks]]
            info["tasks"][name] = len(ids)
            with servers(domain, args.max_errors, args.seed) as running:
                for target in targets:  # warm-up: imports, tool-schema caches, connection pools
                    warm = replay_options(args, name, target, 2, ids[:WARMUP_TASKS])
                    measure_once(warm, running, target, workdir)
                for round_index in range(args.rounds):
                    for step, concurrency in enumerate(args.concurrency):
                        shift = (round_index + step) % len(targets)
                        for target in targets[shift:] + targets[:shift]:
                            options = replay_options(args, name, target, concurrency, ids)
                            sample = measure_once(options, running, target, workdir)
                            key = (name, target, concurrency)
                            cell = cells.setdefault(key, Cell(name, target, concurrency))
                            cell.samples.append(sample)
                            console.print(
                                f"[dim]{name} {target} c{concurrency} round {round_index + 1}: "
                                f"{sample.episodes} episodes in {sample.seconds:.2f} s "
                                f"({sample.per_second:.1f}/s)[/]"
                            )
    return cells, info


def against_direct(
    cells: dict[Key, Cell], key: Key, value: Callable[[Sample, Sample], float]
) -> float | None:
    """Median over rounds of `value(sample, direct sample of the same round)`."""
    cell, base = cells.get(key), cells.get((key[0], "direct", key[2]))
    if cell is None or base is None or key[1] == "direct":
        return None
    pairs = zip(cell.samples, base.samples, strict=False)
    return statistics.median(value(mine, direct) for mine, direct in pairs)


def throughput_ratio(mine: Sample, direct: Sample) -> float:
    return mine.per_second / direct.per_second


def time_share(mine: Sample, direct: Sample) -> float:
    """The share of the target's wall time per agent call that the direct run did not spend."""
    return 1.0 - direct.seconds_per_call / mine.seconds_per_call


def cpu_share(mine: Sample, direct: Sample) -> float:
    """The share of the target's CPU time per agent call that the direct run did not spend."""
    return 1.0 - direct.cpu_per_call / mine.cpu_per_call


# -- report ---------------------------------------------------------------------------------------

COLUMNS = [
    "domain",
    "target",
    "concurrency",
    "episodes/s",
    "× direct",
    "episodes/CPU-s",
    "episode ms",
    "agent calls/ep",
    "upstream calls/ep",
    "wall ms/agent call",
    "CPU ms/agent call",
    "passed",
]


def display_order(key: Key) -> tuple[int, int, int]:
    return DOMAINS.index(key[0]), key[2], TARGETS.index(key[1])


def rows(cells: dict[Key, Cell]) -> list[list[str]]:
    out = []
    for key in sorted(cells, key=display_order):
        cell = cells[key]
        ratio = against_direct(cells, key, throughput_ratio)
        first = cell.samples[0]
        out.append(
            [
                cell.domain,
                cell.target,
                str(cell.concurrency),
                f"{cell.median(lambda s: s.per_second):.1f}",
                "" if ratio is None else f"{ratio:.2f}×",
                f"{cell.median(lambda s: s.per_cpu_second):.1f}",
                f"{cell.median(lambda s: 1000 * statistics.fmean(s.episode_seconds)):.0f}",
                f"{first.agent_calls / first.episodes:.1f}",
                f"{first.upstream_calls / first.episodes:.1f}",
                f"{cell.median(lambda s: 1000 * s.seconds_per_call):.2f}",
                f"{cell.median(lambda s: 1000 * s.cpu_per_call):.2f}",
                f"{first.passed}/{first.episodes}",
            ]
        )
    return out


def headline(cells: dict[Key, Cell], concurrencies: list[int]) -> tuple[list[str], list[list[str]]]:
    """Per domain and proxy target against direct: episodes per CPU-second and the proxy's share
    of the CPU time per agent call (pooled over concurrencies and rounds, the steady figures),
    episodes/s at each concurrency, and the share of wall time per agent call at the lowest."""
    low = min(concurrencies)
    header = [
        "comparison",
        "episodes/CPU-s",
        "proxy's share of CPU time per agent call",
        *(f"episodes/s at c{c}" for c in concurrencies),
        f"proxy's share of wall time per agent call at c{low}",
    ]
    out = []
    for domain in dict.fromkeys(k[0] for k in cells):
        for target in ("proxy", "proxy+repair"):
            if (domain, target, low) not in cells or (domain, "direct", low) not in cells:
                continue
            pairs = [
                pair
                for c in concurrencies
                for pair in zip(
                    cells[(domain, target, c)].samples,
                    cells[(domain, "direct", c)].samples,
                    strict=False,
                )
            ]
            per_cpu = statistics.median(m.per_cpu_second / d.per_cpu_second for m, d in pairs)
            mine_cpu = statistics.median(m.per_cpu_second for m, _ in pairs)
            base_cpu = statistics.median(d.per_cpu_second for _, d in pairs)
            row = [
                f"{domain}: {target} vs direct",
                f"{per_cpu:.2f}× ({mine_cpu:.1f} vs {base_cpu:.1f})",
                f"{100 * statistics.median(cpu_share(m, d) for m, d in pairs):.0f}%",
            ]
            for c in concurrencies:
                ratio = against_direct(cells, (domain, target, c), throughput_ratio)
                mine = cells[(domain, target, c)].median(lambda s: s.per_second)
                base = cells[(domain, "direct", c)].median(lambda s: s.per_second)
                row.append(f"{ratio:.2f}× ({mine:.1f} vs {base:.1f})" if ratio else "–")
            share = against_direct(cells, (domain, target, low), time_share)
            row.append("–" if share is None else f"{100 * share:.0f}%")
            out.append(row)
    return header, out


def show(cells: dict[Key, Cell], args: argparse.Namespace) -> None:
    title = "evalkit replay, embedded (medians over rounds; × direct: same round)"
    console.print(rich_table(title, COLUMNS, rows(cells), text_columns={"domain", "target"}))
    header, ratios = headline(cells, args.concurrency)
    if ratios:
        title = "Headline ratios against direct (absolute figures in brackets)"
        console.print(rich_table(title, header, ratios))


def section(
    cells: dict[Key, Cell], info: dict[str, Any], args: argparse.Namespace, argv: list[str]
) -> str:
    header, ratios = headline(cells, args.concurrency)
    tasks = ", ".join(f"{n} {d}" for d, n in info["tasks"].items())
    parts = [
        SECTION_BEGIN,
        "## evalkit replay (bench/evalkit.py)",
        "",
        f"{dt.datetime.now().strftime('%Y-%m-%d %H:%M')}, {machine()}.",
        f"Command: `{' '.join(['python -m bench.evalkit', *argv])}`; load average at start "
        f"{info['load']}.",
        f"The embedded default of `evalkit replay` (simulated upstream and proxy on loopback "
        f"threads of one process), profile {PROFILE}, scripted user; the first tasks of each "
        f"domain ({tasks}) × {args.trials} trial(s) per measurement, {args.rounds} rounds in "
        "rotating target order, medians shown. Timed: `Replay.run` (the episode loop, results "
        "files included), not start-up. `direct`: the agent talks to the simulated upstream "
        "with no proxy; × direct and the shares are taken within a round. Agent calls: the chat "
        "completions the agent asked for (equal for `direct` and `proxy`: the same episodes); "
        "upstream calls include the proxy's re-asks. CPU: the whole process (agent, user, proxy, "
        "simulated upstream), which holds one GIL and so uses at most one core; episodes/CPU-s "
        "is roughly what a dedicated core would give.",
        "",
        markdown_table(COLUMNS, rows(cells)),
        "",
    ]
    if ratios:
        parts += [markdown_table(header, ratios), ""]
    parts.append(SECTION_END)
    return "\n".join(parts)


def names(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=12, help="first N tasks of each domain [12]")
    parser.add_argument("--trials", type=int, default=1, help="trials per task [1]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds in rotating order [3]")
    parser.add_argument(
        "--concurrency",
        type=lambda s: sorted({int(x) for x in names(s)}),
        default=[1, 4, 8],
        help="episodes at a time, comma-separated [1,4,8]",
    )
    parser.add_argument(
        "--only",
        type=names,
        default=[],
        help=f"comma-separated domains ({', '.join(DOMAINS)}) and/or targets "
        f"({', '.join(TARGETS)}); direct is always measured",
    )
    parser.add_argument("--max-errors", type=int, default=10, help="error budget per episode [10]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated upstream [0]")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS.name}")
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(DOMAINS) - set(TARGETS)
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}")
    if args.tasks < 1 or args.trials < 1 or args.rounds < 1 or min(args.concurrency) < 1:
        parser.error("--tasks, --trials, --rounds and --concurrency must be at least 1")
    args.domains = [d for d in DOMAINS if d in args.only] or list(DOMAINS)
    wanted = {t for t in TARGETS if t in args.only} | {"direct"}
    args.targets = [t for t in TARGETS if t in wanted] if len(wanted) > 1 else list(TARGETS)
    started = time.monotonic()
    cells, info = measure(args)
    show(cells, args)
    console.print(f"[dim]{time.monotonic() - started:.0f} s[/]")
    if not args.no_write:
        text = section(cells, info, args, sys.argv[1:] if argv is None else argv)
        write_section(RESULTS, text, SECTION_BEGIN, SECTION_END)
        console.print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
