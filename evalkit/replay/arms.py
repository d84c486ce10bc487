"""The arms of a replay — one agent configuration each, a model and the repair the proxy applies —
where each arm's results go, and the proxy session of each episode."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evalkit.replay.options import RESULTS, ReplayOptions
from evalkit.sim.profiles import DamageProfile
from proxy.guard.repair import RepairMode
from proxy.headers import MAX_ERRORS_HEADER, REPAIR_HEADER


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
    return f"{safe}+repair" if repair == RepairMode.REASK else safe


def results_path(out: Path, arms: Sequence[Arm], arm: Arm) -> Path:
    """Where an arm's results file goes: `DIR/results.json`, or `DIR/<arm>/results.json`."""
    return out / RESULTS if len(arms) == 1 else out / arm.name / RESULTS


def session_id(run_id: str, arm: Arm, task_id: str, trial: int) -> str:
    """The proxy session of one episode: `<run id>-<arm>-<task>-<trial>`.

    A task id that is long, not printable ASCII, or has a `/` (which no URL path segment can
    carry) is replaced by a hash of it, so the id stays valid for the proxy and its session API.
    """
    task = task_id
    if len(task) > 64 or "/" in task or not (task.isascii() and task.isprintable()):
        task = "task-" + hashlib.sha256(task_id.encode()).hexdigest()[:12]
    return f"{run_id}-{arm.name}-{task}-{trial}"
