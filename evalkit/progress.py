"""The live view of a replay: one progress bar per arm with its mean reward and failures per
episode so far, counted by `evalkit.analysis` as the summary counts them (the proxy's budget).

Where the output is not a terminal (a pipe, a log file) rich's bars show nothing until the end;
`ProgressLines` says the same counts as plain lines there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
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

LINE_INTERVAL_S = (
    10.0  # a bar's count at most this often as a plain line (its first and last always)
)


@dataclass
class ProgressLines:
    """The counts of progress bars as plain lines on `console` when it is not a terminal: a bar's
    first count, then at most one line every `interval_s` seconds, and its last count. A line reads
    `NAME: DONE/TOTAL UNIT  STATS`, printed once what it counts has finished (a test may act on
    it: Ctrl-C from then on keeps that many)."""

    console: Console
    unit: str
    interval_s: float = LINE_INTERVAL_S
    _said: dict[str, float] = field(default_factory=dict)

    def update(self, name: str, completed: int, total: int | None, stats: str) -> None:
        """Say bar `name`'s count `completed` of `total` (None: not known yet) when it is due."""
        if self.console.is_terminal:
            return  # the live bars say it
        now = time.monotonic()
        said = self._said.get(name)
        if said is not None and now - said < self.interval_s and completed != total:
            return
        self._said[name] = now
        count = f"{completed}/{total}" if total is not None else str(completed)
        self.console.print(
            f"{name.strip()}: {count} {self.unit}  {stats}".rstrip(),
            highlight=False,
            soft_wrap=True,  # one line, however narrow the console thinks it is
        )


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
        self.lines = ProgressLines(console, "episodes")
        width = max(len(a.name) for a in replay.arms)
        per_arm = len(replay.tasks) * replay.options.trials
        self.per_arm = per_arm
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
        self.lines.update(arm.name, tally.episodes, self.per_arm, tally.text())

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
