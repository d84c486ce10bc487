"""What a constrained re-ask (`repair: constrain`) needs of every wire protocol: each protocol's
`constrain` (`proxy.protocols.<api>.constrain`) writes a re-ask plan (`proxy.guard.repair.ReaskPlan`:
which call to ask for, which tools to declare `strict: true` with which parameters, whether to ask
for one call only) into a request body in the protocol's own fields; `FOR_API` holds each by its
protocol's `api`. A protocol without one gets plain re-asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from proxy.guard.repair import ReaskPlan
from proxy.protocols.base import API
from proxy.protocols.chat import constrain as chat
from proxy.protocols.messages import constrain as messages
from proxy.protocols.responses import constrain as responses

Constrain = Callable[[dict[str, Any], ReaskPlan], dict[str, Any]]
"""A protocol's constrain: a new request body asking for what the plan says (its input is left
alone)."""

FOR_API: Final[Mapping[str, Constrain]] = {
    API.CHAT: chat.constrain,
    API.RESPONSES: responses.constrain,
    API.MESSAGES: messages.constrain,
}
