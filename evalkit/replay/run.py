"""One replay run: its arms' results as they finish, saved as they go, and the concurrent episodes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
from openai import AsyncOpenAI

from evalkit.agent import AgentWire, LLMAgent, episode_metadata, make_client
from evalkit.domains import get_domain
from evalkit.domains.base import Domain
from evalkit.errors import EndpointError, JudgeError, UsageError
from evalkit.formats import (
    Results,
    SimulationRun,
    make_info,
    read_results,
    write_json_atomic,
    write_results,
)
from evalkit.judge import LLMJudge
from evalkit.orchestrator import run_episode
from evalkit.replay.arms import Arm, plan_arms, results_path, session_id
from evalkit.replay.endpoints import check_reachable, embedded_upstream, fetch_session
from evalkit.replay.options import MANIFEST, PROBE_TIMEOUT_S, WRITE_INTERVAL_S, ReplayOptions
from evalkit.replay.tasks import select_tasks
from evalkit.scoring import NLJudge, RewardInfo, evaluate_with_judge
from evalkit.sim.profiles import DamageProfile, load_profile
from evalkit.tasks import Task
from evalkit.termination import TerminationReason
from evalkit.users import LLMUser, ScriptedUser, UserSimulator
from evalkit.wire import agent_wire


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
                "api": options.api,
                "profile": arm.profile,
                "repair": arm.repair,
                "upstream": upstream,
                "simulated": options.embedded,
                "judge": {"model": options.judge_model, "base_url": options.judge_base_url}
                if options.judge_model
                else None,
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
        """Play every pending episode against `base_url` (the proxy's OpenAI base URL, `…/v1`),
        `concurrency` at a time, in the run's wire protocol.

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
        judge: LLMJudge | None = None
        if options.judge_base_url and options.judge_model:
            await check_reachable(options.judge_base_url, "judge endpoint")
            judge = LLMJudge.at(options.judge_base_url, options.judge_model)
        self.write_manifest()
        user_client: AsyncOpenAI | None = None
        if options.user == "llm" and options.user_base_url:
            user_client = make_client(options.user_base_url)
        wire = agent_wire(options.api, base_url)
        http = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S)
        gate = asyncio.Semaphore(options.concurrency)

        async def play(arm: Arm, task: Task, trial: int) -> None:
            async with gate:
                simulation = await self.play(wire, user_client, arm, task, trial, judge)
                block = simulation.toolsentry if simulation.toolsentry is not None else {}
                # Without the session record the analysis falls back on the headers of each
                # turn, and says so; the reason is kept beside it.
                try:
                    block["proxy_session"] = await fetch_session(
                        http, base_url, _session_of(simulation)
                    )
                except EndpointError as exc:
                    block["proxy_session"] = None
                    block["proxy_session_error"] = exc.message
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
            await wire.close()
            await http.aclose()
            if user_client is not None:
                await user_client.close()
            if judge is not None:
                await judge.close()

    async def play(
        self,
        wire: AgentWire,
        user_client: AsyncOpenAI | None,
        arm: Arm,
        task: Task,
        trial: int,
        judge: NLJudge | None = None,
    ) -> SimulationRun:
        """Play and score one episode of `arm` over `wire`, its NL assertions by `judge` when given; never
        raises for what the endpoints do (a judge that fails makes the episode an
        infrastructure error)."""
        options = self.options
        agent_tools, user_tools = self.domain.toolkit_classes()
        session = session_id(self.run_id, arm, task.id, trial)
        agent = LLMAgent(
            wire,
            arm.model,
            policy=self.domain.policy,
            tools=agent_tools.openai_tools(),
            session_id=session,
            task_id=task.id,
            trial=trial,
            seed=options.seed,
            llm_args={"temperature": 0.0},
            headers=arm.headers(options.max_errors),
            metadata=episode_metadata(task.id, trial, options.seed),
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
        block = simulation.toolsentry if simulation.toolsentry is not None else {}
        try:
            simulation.reward_info = await evaluate_with_judge(
                self.domain, task, simulation.messages, simulation.termination_reason, judge
            )
        except JudgeError as exc:
            simulation.termination_reason = TerminationReason.INFRASTRUCTURE_ERROR.value
            simulation.reward_info = RewardInfo(
                reward=0.0, info={"note": "the NL judge failed", "judge_error": exc.message}
            )
            block["failure"] = exc.message
        block["arm"] = arm.name
        block["api"] = options.api
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


async def _all(coroutines: Iterable[Awaitable[None]]) -> None:
    """Run `coroutines` together; on cancellation or a failure, cancel the rest and wait for them."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def reward_of(simulation: SimulationRun) -> float:
    """The episode's reward (0 when it has none)."""
    return simulation.reward_info.reward if simulation.reward_info is not None else 0.0
