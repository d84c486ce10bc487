"""The live view of a replay: one progress bar per arm with its mean reward and failures per
episode so far, counted by `evalkit.analysis` as the summary counts them (the proxy's budget)."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from evalkit.analysis.budget import Budget
from evalkit.analysis.channels import DeclaredTools, classify_simulation
from evalkit.formats import SimulationRun
from evalkit.replay import Arm, Replay
from evalkit.summary import replay_tools
from evalkit.termination import TerminationReason


@dataclass
class _Tally:
    task: TaskID
    tools: DeclaredTools
    episodes: int = 0
    reward: float = 0.0
    failures: int = 0
    exhausted: int = 0

    def add(self, simulation: SimulationRun) -> None:
        episode = classify_simulation(simulation, self.tools)
        self.episodes += 1
        self.reward += episode.reward
        self.failures += episode.errors_for(Budget.PROXY)
        self.exhausted += episode.termination_reason == TerminationReason.TOO_MANY_ERRORS

    def text(self) -> str:
        if not self.episodes:
            return ""
        return (
            f"reward {100 * self.reward / self.episodes:5.1f}  "
            f"failures/ep {self.failures / self.episodes:4.2f}  exhausted {self.exhausted}"
        )


class ReplayProgress:
    """A context manager showing `replay`'s progress on `console`; `on_episode` feeds it."""

    def __init__(self, replay: Replay, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}", justify="left"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=console,
        )
        width = max(len(a.name) for a in replay.arms)
        per_arm = len(replay.tasks) * replay.options.trials
        self.tallies: dict[str, _Tally] = {}
        tools = replay_tools(replay)
        for arm in replay.arms:
            task = self.progress.add_task(arm.name.ljust(width), total=per_arm, stats="")
            tally = _Tally(task, tools)
            for simulation in replay.runs[arm.name].simulations:
                tally.add(simulation)
            self.tallies[arm.name] = tally
            self.progress.update(task, completed=tally.episodes, stats=tally.text())

    def on_episode(self, arm: Arm, simulation: SimulationRun) -> None:
        """Count a finished episode of `arm`."""
        tally = self.tallies[arm.name]
        tally.add(simulation)
        self.progress.update(tally.task, completed=tally.episodes, stats=tally.text())

    def __enter__(self) -> ReplayProgress:
        self.progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.progress.stop()
