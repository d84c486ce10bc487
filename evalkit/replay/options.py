"""What a replay is told (`ReplayOptions`, JSON-ready so `DIR/replay.json` can resume it), and the
names and defaults of its options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final, Literal

from evalkit.errors import UsageError
from evalkit.orchestrator import DEFAULT_MAX_STEPS
from evalkit.wire import API_NAMES, ApiName
from proxy.guard.repair import RepairMode

MANIFEST: Final = "replay.json"
RESULTS: Final = "results.json"
DEFAULT_PROFILES: Final = ("bf16", "int4")
REPAIR_MODES: Final = (RepairMode.OFF, RepairMode.REASK)
"""The proxy's repair modes a replay arm may run under (`constrain` needs a real upstream)."""
DEFAULT_REPAIRS: Final = REPAIR_MODES
WRITE_INTERVAL_S: Final = 2.0
PROBE_TIMEOUT_S: Final = 5.0

UserKind = Literal["scripted", "llm"]
USER_KINDS: Final[tuple[UserKind, ...]] = ("scripted", "llm")


@dataclass(frozen=True)
class ReplayOptions:
    """Everything a replay is told; JSON-ready, so `DIR/replay.json` can resume it.

    `profiles` and `repairs` are lists: the arms are their product. With `base_url`, `model`
    names the one model and `profiles` is unused; an empty `repairs` then leaves repair to the
    proxy's own configuration. `api` is the wire protocol the agent speaks to the proxy (a
    manifest written before it existed resumes as chat).
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
    judge_base_url: str | None = None
    judge_model: str | None = None
    api: ApiName = "chat"

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
        if self.user not in USER_KINDS:
            raise UsageError(f"--user must be one of {', '.join(USER_KINDS)}, got {self.user!r}")
        if self.api not in API_NAMES:
            raise UsageError(f"--api must be one of {', '.join(API_NAMES)}, got {self.api!r}")
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
        if bool(self.judge_base_url) != bool(self.judge_model):
            raise UsageError("--judge-base-url and --judge-model go together")
