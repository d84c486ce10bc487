"""Chat Completions (`POST /v1/chat/completions`): everything the proxy knows of the protocol.

`adapter` reads a request into the turn's view, reads and writes replies, and asks again;
`stream` assembles a streamed answer; `answer` writes a neutral answer as vLLM does (the fakes
and the simulator use it); `constrain` writes a constrained re-ask; `schema` is the route's
request schema.
"""

from proxy.protocols.chat.adapter import ChatProtocol
from proxy.protocols.chat.stream import ChatAssembly

__all__ = ["ChatAssembly", "ChatProtocol"]
