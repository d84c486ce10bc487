"""The Anthropic Messages API (`POST /v1/messages`): everything the proxy knows of the protocol.

`adapter` reads a request into the turn's view, reads and writes replies and their streams, and
asks again; `tools` translates the request's tools to the chat form the guard reads; `answer`
writes a neutral answer as vLLM does (the fakes, the simulator and the adapter use it);
`constrain` writes a constrained re-ask; `schema` is the route's request schema.
"""

from proxy.protocols.messages.adapter import MessagesProtocol
from proxy.protocols.messages.stream import MessagesAssembly

__all__ = ["MessagesAssembly", "MessagesProtocol"]
