"""`evalkit replay`: run a domain's tasks through the proxy, arm by arm, and keep every episode.

An *arm* is one agent configuration: a model (a simulated profile such as `sim-int4`, or a real
model behind `--base-url`) and a repair mode the proxy applies (`x-toolsentry-repair`). Without a
base URL the run is self-contained: the simulated upstream and the proxy start in this process
on free loopback ports, and the default arms — bf16 and int4, each with repair off and on — show
on one screen what a flat score hides and what repair recovers.

Episodes of all arms run concurrently on one event loop, each with its own proxy session
(`<run id>-<arm>-<task>-<trial>`), its reward computed as it ends. Each arm's results are a
τ²-bench-compatible results file (`DIR/results.json` for one arm, `DIR/<arm>/results.json` for
several), rewritten as episodes finish, so an interrupted run keeps what it finished;
`DIR/replay.json` records the options, and `--resume DIR` runs what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast
from urllib.parse import quote

import httpx
from openai import AsyncOpenAI

from evalkit.agent import LLMAgent, episode_metadata, make_client
from evalkit.domains import get_domain
from evalkit.domains.base import Domain
from evalkit.errors import DataError, EndpointError, UsageError
from evalkit.formats import (
    Results,
    SimulationRun,
    make_info,
    read_results,
    write_json_atomic,
    write_results,
)
from evalkit.orchestrator import DEFAULT_MAX_STEPS, run_episode
from evalkit.scoring import evaluate
from evalkit.sim.profiles import DamageProfile, load_profile
from evalkit.tasks import Task
from evalkit.users import LLMUser, ScriptedUser, UserSimulator

MANIFEST: Final = "replay.json"
RESULTS: Final = "results.json"
DEFAULT_PROFILES: Final = ("bf16", "int4")
DEFAULT_REPAIRS: Final = ("off", "reask")
REPAIR_MODES: Final = ("off", "reask")
REPAIR_HEADER: Final = "x-toolsentry-repair"
MAX_ERRORS_HEADER: Final = "x-toolsentry-max-errors"
WRITE_INTERVAL_S: Final = 2.0
PROBE_TIMEOUT_S: Final = 5.0

UserKind = Literal["scripted", "llm"]


@dataclass(frozen=True)
class ReplayOptions:
    """Everything a replay is told; JSON-ready, so `DIR/replay.json` can resume it.

    `profiles` and `repairs` are lists: the arms are their product. With `base_url`, `model`
    names the one model and `profiles` is unused; an empty `repairs` then leaves repair to the
    proxy's own configuration.
    """

    domain: str = "retail"
    base_url: str | None = None
    model: str | None = None
    profiles: tuple[str, ...] = DEFAULT_PROFILES
    int4_multiplier: float = 2.5
    user: UserKind = "scripted"
    user_base_url: str | None = None
    user_model: str | None = None
    trials: int = 1
    max_errors: int = 10
    max_steps: int = DEFAULT_MAX_STEPS
    repairs: tuple[str, ...] = DEFAULT_REPAIRS
    tasks: str | None = None
    concurrency: int = 8
    seed: int = 0
    data_dir: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        data = dataclasses.asdict(self)
        data["profiles"] = list(self.profiles)
        data["repairs"] = list(self.repairs)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplayOptions:
        """Options back from `to_dict` output (unknown keys ignored).

        Raises:
            UsageError: when a value has the wrong type.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("profiles", "repairs"):
            if key in values:
                values[key] = tuple(values[key])
        try:
            return cls(**values)
        except TypeError as exc:
            raise UsageError(f"the replay options are not valid: {exc}") from None

    @property
    def embedded(self) -> bool:
        """Whether the run starts its own simulated upstream and proxy."""
        return self.base_url is None

    def check(self) -> None:
        """Refuse options that cannot run, saying why.

        Raises:
            UsageError: naming the option.
        """
        if self.trials < 1:
            raise UsageError("--trials must be at least 1")
        if self.max_errors < 1:
            raise UsageError("--max-errors must be at least 1")
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        for mode in self.repairs:
            if mode not in REPAIR_MODES:
                raise UsageError(f"--repair must be one of {', '.join(REPAIR_MODES)}, got {mode!r}")
        if self.base_url is not None and not self.model:
            raise UsageError("--base-url needs --model (the model the server serves)")
        if self.base_url is None and not self.profiles:
            raise UsageError("--profile needs at least one profile")
        if self.user == "llm" and not (self.user_base_url and self.user_model):
            raise UsageError("--user llm needs --user-base-url and --user-model")


@dataclass(frozen=True)
class Arm:
    """One agent configuration of a run: the model asked for and the repair the proxy applies."""

    name: str
    model: str
    profile: str | None
    repair: str | None

    def headers(self, max_errors: int) -> dict[str, str]:
        """The proxy headers of the arm's requests."""
        headers = {MAX_ERRORS_HEADER: str(max_errors)}
        if self.repair is not None:
            headers[REPAIR_HEADER] = self.repair
        return headers


def plan_arms(options: ReplayOptions, profiles: Sequence[DamageProfile] = ()) -> list[Arm]:
    """The arms of a run, in display order: per profile (or the model), per repair mode."""
    repairs: Sequence[str | None] = options.repairs or [None]
    if options.base_url is not None:
        model = options.model or ""
        return [Arm(_arm_name(model, r), model, None, r) for r in repairs]
    return [Arm(_arm_name(p.name, r), p.model, p.name, r) for p in profiles for r in repairs]


def _arm_name(label: str, repair: str | None) -> str:
    safe = label.replace("/", "_")
    return f"{safe}+repair" if repair == "reask" else safe


def results_path(out: Path, arms: Sequence[Arm], arm: Arm) -> Path:
    """Where an arm's results file goes: `DIR/results.json`, or `DIR/<arm>/results.json`."""
    return out / RESULTS if len(arms) == 1 else out / arm.name / RESULTS


# -- tasks ---------------------------------------------------------------------------------


def select_tasks(domain: Domain, spec: str | None, data_dir: Path | None = None) -> list[Task]:
    """The tasks `spec` names: None for all, a split name, or comma-separated task ids.

    Splits come from `split_tasks.json` in the domain's data directory (τ²-bench's file).

    Raises:
        UsageError: when an id is not a task of the domain (the message shows valid ones).
    """
    if spec is None or not spec.strip():
        return list(domain.tasks)
    splits = _splits(domain.name, data_dir)
    if spec in splits:
        wanted = [str(i) for i in splits[spec]]
    else:
        wanted = [part.strip() for part in spec.split(",") if part.strip()]
    known = {t.id for t in domain.tasks}
    missing = [t for t in wanted if t not in known]
    if missing:
        sample = ", ".join(t.id for t in domain.tasks[:8])
        split_names = f"; splits: {', '.join(sorted(splits))}" if splits else ""
        raise UsageError(
            f"domain {domain.name!r} has no task {missing[0]!r} (tasks: {sample}, …{split_names})"
        )
    return [domain.get_task(t) for t in dict.fromkeys(wanted)]


def _splits(domain: str, data_dir: Path | None) -> dict[str, list[Any]]:
    import evalkit.domains

    directory = data_dir or Path(evalkit.domains.__file__).parent / domain / "data"
    path = directory / "split_tasks.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read the task splits: {exc}") from None
    return {k: v for k, v in data.items() if isinstance(v, list)} if isinstance(data, dict) else {}


# -- rewards ---------------------------------------------------------------------------------


def reward_of(simulation: SimulationRun) -> float:
    """The episode's reward (0 when it has none)."""
    return simulation.reward_info.reward if simulation.reward_info is not None else 0.0


# -- endpoints -------------------------------------------------------------------------------


async def check_reachable(base_url: str, what: str) -> None:
    """Fail fast when nothing answers at `base_url` (a GET of `/models`; any HTTP answer will do).

    Raises:
        EndpointError: naming `what` and the URL, when the connection fails or times out.
    """
    url = f"{base_url.rstrip('/')}/models"
    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as client:
            await client.get(url)
    except httpx.TimeoutException:
        raise EndpointError(
            f"the {what} at {base_url} did not answer within {PROBE_TIMEOUT_S:g} s"
        ) from None
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise EndpointError(
            f"cannot reach the {what} at {base_url}: {reason} (is the server running?)"
        ) from None


@contextlib.contextmanager
def proxy_in_front(upstream: str, *, max_errors: int, name: str = "upstream") -> Iterator[str]:
    """Start the toolsentry proxy on a free loopback port in front of the OpenAI base URL
    `upstream`, with budget `max_errors` and per-request overrides allowed (the arms' repair).

    Yields the proxy's OpenAI base URL; the proxy stops on exit.
    """
    from proxy.app import create_app
    from proxy.config import Settings, UpstreamConfig
    from proxy.testing import LoopbackServer

    settings = Settings(
        upstreams=[UpstreamConfig(name=name, base_url=upstream)],
        max_errors=max_errors,
        allow_overrides=True,
    )
    proxy = LoopbackServer(create_app(settings))
    proxy.start()
    try:
        yield f"{proxy.url}/v1"
    finally:
        proxy.stop()


@contextlib.contextmanager
def embedded_upstream(
    domain: Domain, options: ReplayOptions, profiles: dict[str, DamageProfile]
) -> Iterator[str]:
    """Start the simulated upstream and a proxy in front of it on free loopback ports.

    Yields the proxy's OpenAI base URL; both servers stop on exit. The proxy's budget is the
    run's `max_errors`; arms choose repair per request.
    """
    from evalkit.sim.server import create_sim_app
    from proxy.testing import LoopbackServer

    first = next(iter(profiles))
    sim = LoopbackServer(create_sim_app(domain, profiles, default_profile=first, seed=options.seed))
    sim.start()
    try:
        with proxy_in_front(
            f"{sim.url}/v1", max_errors=options.max_errors, name="evalkit-sim"
        ) as base_url:
            yield base_url
    finally:
        sim.stop()


# -- the run --------------------------------------------------------------------------------


@dataclass
class ArmRun:
    """An arm's results so far: the tasks it runs and the simulations it finished."""

    arm: Arm
    path: Path
    info: dict[str, Any]
    simulations: list[SimulationRun] = field(default_factory=list)
    dirty: bool = False

    def done(self) -> set[tuple[str, int]]:
        """The (task, trial) pairs already finished."""
        return {(s.task_id, s.trial or 0) for s in self.simulations}


EpisodeCallback = Callable[[Arm, SimulationRun], None]


class Replay:
    """One replay run: its options, arms, tasks and output directory.

    Build it with `Replay.start` (a new run) or `Replay.resume` (finish one); then `await
    run(base_url)` plays every missing episode.
    """

    def __init__(
        self,
        options: ReplayOptions,
        out: Path,
        domain: Domain,
        tasks: list[Task],
        run_id: str,
    ) -> None:
        self.options = options
        self.out = out
        self.domain = domain
        self.tasks = tasks
        self.profiles: dict[str, DamageProfile] = {}
        if options.embedded:
            for spec in options.profiles:
                profile = load_profile(spec, int4_multiplier=options.int4_multiplier)
                self.profiles[profile.name] = profile
        self.arms = plan_arms(options, list(self.profiles.values()))
        self.run_id = run_id
        self.runs = {arm.name: self._arm_run(arm) for arm in self.arms}
        self._order = {t.id: i for i, t in enumerate(tasks)}
        self._last_write = 0.0

    @classmethod
    def start(cls, options: ReplayOptions, out: Path) -> Replay:
        """A new run of `options` writing to `out`.

        Raises:
            UsageError: for invalid options, an unknown domain (listing the valid ones), tasks
                or profiles.
            DataError: when the domain's files cannot be loaded.
        """
        options.check()
        data_dir = Path(options.data_dir) if options.data_dir else None
        domain = get_domain(options.domain, data_dir)
        tasks = select_tasks(domain, options.tasks, data_dir)
        return cls(options, out, domain, tasks, uuid.uuid4().hex[:8])

    @classmethod
    def resume(cls, out: Path) -> Replay:
        """The run recorded in `out`, with the episodes it already finished.

        Raises:
            UsageError: when `out` holds no replay manifest.
            ResultsFileError: when a results file there is corrupt.
        """
        manifest = out / MANIFEST
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"{out}: no replay to resume ({MANIFEST} is missing)") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{manifest}: cannot read the replay manifest: {exc}") from None
        options = ReplayOptions.from_dict(data.get("options", {}))
        options.check()
        data_dir = Path(options.data_dir) if options.data_dir else None
        domain = get_domain(options.domain, data_dir)
        tasks = select_tasks(domain, options.tasks, data_dir)
        replay = cls(options, out, domain, tasks, uuid.uuid4().hex[:8])
        for run in replay.runs.values():
            if run.path.is_file():
                loaded = read_results(run.path)
                known = {t.id for t in tasks}
                run.simulations = [s for s in loaded.simulations if s.task_id in known]
        return replay

    def _arm_run(self, arm: Arm) -> ArmRun:
        options = self.options
        upstream = "embedded simulated upstream" if options.embedded else options.base_url
        user: dict[str, Any] = {"implementation": f"{options.user}_user"}
        if options.user == "llm":
            user["llm"] = options.user_model
        info = make_info(
            domain=self.domain.name,
            policy=self.domain.policy,
            agent={
                "implementation": "llm_agent",
                "llm": arm.model,
                "llm_args": {"temperature": 0.0},
            },
            user=user,
            num_trials=options.trials,
            max_steps=options.max_steps,
            max_errors=options.max_errors,
            seed=options.seed,
            toolsentry={
                "arm": arm.name,
                "profile": arm.profile,
                "repair": arm.repair,
                "upstream": upstream,
                "simulated": options.embedded,
            },
        )
        return ArmRun(arm, results_path(self.out, self.arms, arm), info)

    def write_manifest(self) -> None:
        """Record the options in `DIR/replay.json` (what `--resume` reads)."""
        write_json_atomic(
            self.out / MANIFEST,
            {
                "options": self.options.to_dict(),
                "arms": [dataclasses.asdict(a) for a in self.arms],
                "results": {
                    a.name: str(self.runs[a.name].path.relative_to(self.out)) for a in self.arms
                },
            },
        )

    def pending(self) -> list[tuple[Arm, Task, int]]:
        """The episodes still to play, trial by trial, task by task, arm by arm."""
        out = []
        for trial in range(self.options.trials):
            for task in self.tasks:
                for arm in self.arms:
                    if (task.id, trial) not in self.runs[arm.name].done():
                        out.append((arm, task, trial))
        return out

    def total(self) -> int:
        """Episodes in the whole run, finished or not."""
        return len(self.arms) * len(self.tasks) * self.options.trials

    def results(self, arm: Arm) -> Results:
        """The arm's results file as it stands, simulations in task and trial order."""
        run = self.runs[arm.name]
        ordered = sorted(
            run.simulations, key=lambda s: (self._order.get(s.task_id, 0), s.trial or 0)
        )
        return Results(info=run.info, tasks=self.tasks, simulations=ordered)

    def save(self, *, force: bool = False) -> None:
        """Rewrite the results files that changed (at most every few seconds unless `force`)."""
        now = time.monotonic()
        if not force and now - self._last_write < WRITE_INTERVAL_S:
            return
        self._last_write = now
        for arm in self.arms:
            run = self.runs[arm.name]
            if run.dirty or force:
                write_results(run.path, self.results(arm))
                run.dirty = False

    async def run(self, base_url: str, on_episode: EpisodeCallback | None = None) -> None:
        """Play every pending episode against `base_url` (the proxy), `concurrency` at a time.

        Results are saved as episodes finish and once more at the end, also when cancelled
        (Ctrl-C): finished episodes are never lost.

        Raises:
            EndpointError: when an endpoint given by URL cannot be reached.
        """
        options = self.options
        if not options.embedded:
            await check_reachable(base_url, "agent endpoint")
        if options.user == "llm" and options.user_base_url:
            await check_reachable(options.user_base_url, "user endpoint")
        self.write_manifest()
        user_client: AsyncOpenAI | None = None
        if options.user == "llm" and options.user_base_url:
            user_client = make_client(options.user_base_url)
        client = make_client(base_url)
        http = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S)
        gate = asyncio.Semaphore(options.concurrency)

        async def play(arm: Arm, task: Task, trial: int) -> None:
            async with gate:
                simulation = await self.play(client, user_client, arm, task, trial)
                block = simulation.toolsentry if simulation.toolsentry is not None else {}
                block["proxy_session"] = await fetch_session(
                    http, base_url, _session_of(simulation)
                )
                simulation.toolsentry = block
            run = self.runs[arm.name]
            run.simulations.append(simulation)
            run.dirty = True
            if on_episode is not None:
                on_episode(arm, simulation)
            self.save()

        try:
            await _all(play(arm, task, trial) for arm, task, trial in self.pending())
        finally:
            self.save(force=True)
            await client.close()
            await http.aclose()
            if user_client is not None:
                await user_client.close()

    async def play(
        self,
        client: AsyncOpenAI,
        user_client: AsyncOpenAI | None,
        arm: Arm,
        task: Task,
        trial: int,
    ) -> SimulationRun:
        """Play and score one episode of `arm`; never raises for what the endpoints do."""
        options = self.options
        agent_tools, user_tools = self.domain.toolkit_classes()
        session = session_id(self.run_id, arm, task.id, trial)
        agent = LLMAgent(
            client,
            arm.model,
            policy=self.domain.policy,
            tools=agent_tools.openai_tools(),
            session_id=session,
            task_id=task.id,
            trial=trial,
            seed=options.seed,
            llm_args={
                "temperature": 0.0,
                "extra_headers": arm.headers(options.max_errors),
                "extra_body": {"metadata": episode_metadata(task.id, trial, options.seed)},
            },
        )
        user: UserSimulator
        if user_client is not None and options.user_model:
            tools = user_tools.openai_tools() if user_tools is not None else None
            user = LLMUser(user_client, options.user_model, task, tools=tools)
        else:
            user = scripted_user(self.domain, task)
        simulation = await run_episode(
            self.domain,
            task,
            agent,
            user,
            max_steps=options.max_steps,
            max_errors=options.max_errors,
            trial=trial,
            seed=options.seed,
        )
        simulation.reward_info = evaluate(
            self.domain, task, simulation.messages, simulation.termination_reason
        )
        block = simulation.toolsentry if simulation.toolsentry is not None else {}
        block["arm"] = arm.name
        block["session_id"] = session
        simulation.toolsentry = block
        return simulation


async def execute(replay: Replay, on_episode: EpisodeCallback | None = None) -> None:
    """Run `replay` against its base URL, or against an embedded simulated upstream and proxy.

    Raises:
        EndpointError: when an endpoint given by URL cannot be reached.
    """
    if replay.options.base_url is not None:
        await replay.run(replay.options.base_url, on_episode)
        return
    with embedded_upstream(replay.domain, replay.options, replay.profiles) as base_url:
        await replay.run(base_url, on_episode)


def _session_of(simulation: SimulationRun) -> str:
    return str((simulation.toolsentry or {}).get("session_id", ""))


def session_id(run_id: str, arm: Arm, task_id: str, trial: int) -> str:
    """The proxy session of one episode: `<run id>-<arm>-<task>-<trial>`.

    A task id that is long, not printable ASCII, or has a `/` (which no URL path segment can
    carry) is replaced by a hash of it, so the id stays valid for the proxy and its session API.
    """
    task = task_id
    if len(task) > 64 or "/" in task or not (task.isascii() and task.isprintable()):
        task = "task-" + hashlib.sha256(task_id.encode()).hexdigest()[:12]
    return f"{run_id}-{arm.name}-{task}-{trial}"


def scripted_user(domain: Domain, task: Task) -> UserSimulator:
    """The scripted customer of `task`, operating their device by the domain's rules if it has any.

    Domains with a device (telecom) provide those rules through `evalkit.users.scripted_user`;
    without that factory every domain gets a plain `ScriptedUser`.
    """
    from evalkit import users

    factory = getattr(users, "scripted_user", None)
    if factory is None:
        return ScriptedUser(task)
    return cast(UserSimulator, factory(domain, task))


async def fetch_session(
    http: httpx.AsyncClient, base_url: str, session: str
) -> dict[str, Any] | None:
    """The proxy's record of `session` (`GET /v1/sessions/{id}`), or None when it gives none.

    A server without the session API, or one that wants an admin key, gives none.
    """
    url = f"{base_url.rstrip('/')}/sessions/{quote(session, safe='')}"
    try:
        response = await http.get(url)
        data = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def _all(coroutines: Iterable[Awaitable[None]]) -> None:
    """Run `coroutines` together; on cancellation or a failure, cancel the rest and wait for them."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = [
    "Arm",
    "Replay",
    "ReplayOptions",
    "check_reachable",
    "embedded_upstream",
    "execute",
    "plan_arms",
    "select_tasks",
]
