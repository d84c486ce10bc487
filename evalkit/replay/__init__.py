"""`evalkit replay`: run a domain's tasks through the proxy, arm by arm, and keep every episode.

An *arm* is one agent configuration: a model (a simulated profile such as `sim-int4`, or a real
model behind `--base-url`) and a repair mode the proxy applies (`x-toolsentry-repair`). Without a
base URL the run is self-contained: the simulated upstream and the proxy start in this process
on free loopback ports, and the default arms — bf16 and int4, each with repair off and on — show
on one screen what a flat score hides and what repair recovers.

The agent speaks one wire protocol to the proxy, `--api chat` (the default), `responses` or
`messages` (`evalkit.wire`): the same episodes, seed for seed, give the same results on each.

Episodes of all arms run concurrently on one event loop, each with its own proxy session
(`<run id>-<arm>-<task>-<trial>`), its reward computed as it ends. Each arm's results are a
τ²-bench-compatible results file (`DIR/results.json` for one arm, `DIR/<arm>/results.json` for
several), rewritten as episodes finish, so an interrupted run keeps what it finished;
`DIR/replay.json` records the options, and `--resume DIR` runs what is missing.
"""

from evalkit.replay.arms import Arm, plan_arms, results_path, session_id
from evalkit.replay.endpoints import (
    check_reachable,
    embedded_upstream,
    fetch_session,
    proxy_in_front,
)
from evalkit.replay.options import (
    DEFAULT_PROFILES,
    DEFAULT_REPAIRS,
    MANIFEST,
    RESULTS,
    ReplayOptions,
    UserKind,
)
from evalkit.replay.run import ArmRun, EpisodeCallback, Replay, execute, reward_of, scripted_user
from evalkit.replay.tasks import select_tasks

__all__ = [
    "DEFAULT_PROFILES",
    "DEFAULT_REPAIRS",
    "MANIFEST",
    "RESULTS",
    "Arm",
    "ArmRun",
    "EpisodeCallback",
    "Replay",
    "ReplayOptions",
    "UserKind",
    "check_reachable",
    "embedded_upstream",
    "execute",
    "fetch_session",
    "plan_arms",
    "proxy_in_front",
    "results_path",
    "reward_of",
    "scripted_user",
    "select_tasks",
    "session_id",
]
