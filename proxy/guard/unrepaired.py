"""What the client gets, per failure channel, when repair gave up on a message (`on_unrepaired`,
DESIGN §6): the setting read into a policy, and the defaults chosen from what real clients do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from proxy.guard.channels import Channel, Violation
from proxy.guard.repair import OnUnrepaired

DEFAULT_KEY: Final = "default"
"""The key of `on_unrepaired`'s mapping that names the policy of every channel it does not name."""

DEFAULT_ON_UNREPAIRED: Final[Mapping[str, str]] = {
    DEFAULT_KEY: OnUnrepaired.PASSTHROUGH.value,
    Channel.UNKNOWN_TOOL.value: OnUnrepaired.STRIP.value,
}
"""The default, chosen from what the tested clients do with each failure (docs/clients.md):
each of them reports a schema violation or malformed arguments back to the model and goes on, and
so do Codex CLI and Claude Code with a call to an undeclared tool, but the OpenAI Agents SDK's run
dies on one (`ModelBehaviorError: Tool X not found`). So an undeclared call is stripped and every
other failure passes through. `reject` (422) is retried by Codex CLI and Claude Code and ends an
Agents SDK run: no default uses it."""


@dataclass(frozen=True, slots=True)
class UnrepairedPolicy:
    """`on_unrepaired` per channel: the `channels` named, `default` for the rest."""

    default: OnUnrepaired = OnUnrepaired.PASSTHROUGH
    channels: Mapping[Channel, OnUnrepaired] = field(default_factory=dict)

    @classmethod
    def read(cls, value: str | Mapping[str, str]) -> UnrepairedPolicy:
        """The policy a setting spells: one value for every channel, or a mapping of channel
        names (and `default`) to values.

        Raises ValueError naming a key or value it does not know.
        """
        if isinstance(value, str):
            return cls(_policy(value))
        default, channels = OnUnrepaired.PASSTHROUGH, {}
        for key, policy in value.items():
            if key == DEFAULT_KEY:
                default = _policy(policy)
            elif key in _CHANNELS:
                channels[Channel(key)] = _policy(policy)
            else:
                known = ", ".join([DEFAULT_KEY, *_CHANNELS])
                raise ValueError(f"unknown channel {key!r} (one of {known})")
        return cls(default, channels)

    def of(self, channel: Channel) -> OnUnrepaired:
        """The policy for a failure of `channel`."""
        return self.channels.get(channel, self.default)

    def strongest(self, violations: Sequence[Violation]) -> OnUnrepaired:
        """The policy a message with `violations` gets, as one word: `reject` if any of them
        rejects, else `strip` if any strips, else `passthrough`."""
        policies = {self.of(v.channel) for v in violations}
        for policy in (OnUnrepaired.REJECT, OnUnrepaired.STRIP):
            if policy in policies:
                return policy
        return OnUnrepaired.PASSTHROUGH


_CHANNELS: Final = tuple(c.value for c in Channel if c.repairable)


def _policy(value: str) -> OnUnrepaired:
    try:
        return OnUnrepaired(value)
    except ValueError:
        valid = ", ".join(p.value for p in OnUnrepaired)
        raise ValueError(f"{value!r} is not one of {valid}") from None
