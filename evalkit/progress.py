"""The live view of a replay: one progress bar per arm with its pass rate and errors so far."""

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

from evalkit.formats import SimulationRun
from evalkit.replay import Arm, Replay, episode_errors, reward_of
from evalkit.scoring import is_success


@dataclass
class _Tally:
    task: TaskID
    episodes: int = 0
    passes: int = 0
    errors: int = 0
    exhausted: int = 0

    def add(self, simulation: SimulationRun) -> None:
        self.episodes += 1
        self.passes += is_success(reward_of(simulation))
        self.errors += episode_errors(simulation)
        self.exhausted += simulation.termination_reason == "too_many_errors"

    def text(self) -> str:
        if not self.episodes:
            return ""
        rate = 100 * self.passes / self.episodes
        return (
            f"pass {rate:5.1f}%  errors/ep {self.errors / self.episodes:4.2f}  "
            f"exhausted {self.exhausted}"
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
        for arm in replay.arms:
            task = self.progress.add_task(arm.name.ljust(width), total=per_arm, stats="")
            tally = _Tally(task)
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
