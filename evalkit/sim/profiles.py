"""Damage profiles of the simulated upstream: how often it errs on each channel, and how it recovers.

A profile's channel rates are per-call probabilities: every time the simulated model is about to
make a tool call it draws once, and makes at most one mistake. `recover` is the probability that
the turn after an environment error is back on track (else it gives up with probability
`give_up`, or repeats the mistake); `reask_fix` the probability that a corrective re-ask (the
proxy's repair) yields the right call; `policy_error` the probability, per episode, of a valid
but wrong decision no validator can see (the model closes the conversation before the last
state-changing action).

The built-in profiles share everything but the channel rates: `fp8` has 1.3× and `int4` a
configurable multiple (default 2.5×) of `bf16`'s, so a more quantized model makes the same
mistakes more often: with proportional rates the simulated model's draws nest (evalkit/sim/model.py),
so on the same request `int4` makes every mistake `bf16` makes, and more. A custom profile is a
YAML file:

    name: int4-awq          # the model is then served as sim-int4-awq
    base: bf16              # optional: start from a built-in profile ...
    multiplier: 3.0         # ... with its channel rates multiplied
    unknown_tool: 0.12      # optional: any field set explicitly
    wrong_tool_names:       # optional: its own weighted wrong names instead of the domain's
      purge_account: 5
      wire_money: 3
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evalkit.errors import UsageError
from proxy.guard import Channel

CHANNEL_FIELDS: Final = (
    Channel.UNKNOWN_TOOL,
    Channel.MALFORMED_ARGUMENTS,
    Channel.SCHEMA_VIOLATION,
    Channel.LEAKED_TOOL_CALL,
)
"""The channels a profile errs on, in the order mistakes are drawn; each is a rate field of the
same name (a `Channel` is its name)."""
DEFAULT_INT4_MULTIPLIER = 2.5
FP8_MULTIPLIER = 1.3
MAX_MISTAKE_RATE = 0.9


class DamageProfile(BaseModel):
    """Error rates and recovery behaviour of one simulated model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    unknown_tool: float = Field(ge=0, le=1)
    malformed_arguments: float = Field(ge=0, le=1)
    schema_violation: float = Field(ge=0, le=1)
    leaked_tool_call: float = Field(ge=0, le=1)
    recover: float = Field(ge=0, le=1)
    give_up: float = Field(ge=0, le=1)
    reask_fix: float = Field(ge=0, le=1)
    policy_error: float = Field(ge=0, le=1)
    wrong_tool_names: dict[str, int] | None = Field(
        default=None,
        description="Weighted wrong tool names of this profile; None: the domain's vocabulary.",
    )

    @model_validator(mode="after")
    def _rates_leave_room_for_a_right_call(self) -> DamageProfile:
        if self.mistake_rate > MAX_MISTAKE_RATE:
            raise ValueError(
                f"the channel rates add up to {self.mistake_rate:.2f}; at most "
                f"{MAX_MISTAKE_RATE} so that some calls are right"
            )
        return self

    @property
    def model(self) -> str:
        """The model name the simulated upstream serves this profile as."""
        return f"sim-{self.name}"

    @property
    def mistake_rate(self) -> float:
        """The probability that a tool call goes wrong on some channel."""
        return float(sum(getattr(self, f) for f in CHANNEL_FIELDS))

    def channel_rates(self) -> dict[Channel, float]:
        """The per-call rate of each channel, in the order mistakes are drawn."""
        return {f: float(getattr(self, f)) for f in CHANNEL_FIELDS}

    def scaled(self, factor: float, *, name: str) -> DamageProfile:
        """A copy named `name` with every channel rate multiplied by `factor`.

        Raises:
            ValueError: when the scaled rates add up to more than `MAX_MISTAKE_RATE`.
        """
        rates = {f: getattr(self, f) * factor for f in CHANNEL_FIELDS}
        return DamageProfile.model_validate({**self.model_dump(), **rates, "name": name})


BF16 = DamageProfile(
    name="bf16",
    unknown_tool=0.05,
    malformed_arguments=0.012,
    schema_violation=0.02,
    leaked_tool_call=0.008,
    recover=0.75,
    give_up=0.1,
    reask_fix=0.75,
    policy_error=0.18,
)


def builtin_profiles(int4_multiplier: float = DEFAULT_INT4_MULTIPLIER) -> dict[str, DamageProfile]:
    """`bf16`, `fp8` and `int4`, by name.

    Raises:
        UsageError: when `int4_multiplier` makes the rates impossible.
    """
    try:
        return {
            "bf16": BF16,
            "fp8": BF16.scaled(FP8_MULTIPLIER, name="fp8"),
            "int4": BF16.scaled(int4_multiplier, name="int4"),
        }
    except ValidationError as exc:
        raise UsageError(f"int4 multiplier {int4_multiplier}: {_first_problem(exc)}") from None


def load_profile(spec: str, *, int4_multiplier: float = DEFAULT_INT4_MULTIPLIER) -> DamageProfile:
    """A built-in profile by name (`bf16`, `fp8`, `int4`) or a custom one from a YAML file.

    Raises:
        UsageError: when `spec` is neither a built-in name nor a readable, valid profile file.
    """
    builtins = builtin_profiles(int4_multiplier)
    if spec in builtins:
        return builtins[spec]
    path = Path(spec)
    if not path.is_file():
        names = ", ".join(builtins)
        raise UsageError(f"unknown profile {spec!r}: use one of {names} or a YAML file path")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read the profile: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a profile file must be a mapping of fields")
    return profile_from_mapping(data, builtins, source=str(path))


def profile_from_mapping(
    data: dict[str, Any], builtins: dict[str, DamageProfile], *, source: str
) -> DamageProfile:
    """A profile from a decoded YAML mapping (`base`, `multiplier`, then explicit fields).

    Raises:
        UsageError: when the base is unknown or a field is invalid.
    """
    fields = dict(data)
    base_name = fields.pop("base", None)
    multiplier = fields.pop("multiplier", None)
    merged: dict[str, Any] = {}
    if base_name is not None:
        base = builtins.get(str(base_name))
        if base is None:
            raise UsageError(f"{source}: unknown base profile {base_name!r}")
        merged = base.model_dump()
        if multiplier is not None:
            merged.update({f: merged[f] * float(multiplier) for f in CHANNEL_FIELDS})
    elif multiplier is not None:
        raise UsageError(f"{source}: 'multiplier' needs a 'base' profile")
    merged.update(fields)
    merged.setdefault("name", Path(source).stem)
    try:
        return DamageProfile.model_validate(merged)
    except ValidationError as exc:
        raise UsageError(f"{source}: not a damage profile: {_first_problem(exc)}") from None


def _first_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where + ': ' if where else ''}{first['msg']}"
