"""The Responses API (`POST /v1/responses`): everything the proxy knows of the protocol.

`adapter` reads a request into the turn's view, reads and writes replies and their streams, and
asks again; `tools` translates the request's tools to the chat form the guard reads; `answer`
writes a neutral answer, and every stream's event sequence, as vLLM does (the fakes, the
simulator and the adapter use it); `constrain` writes a constrained re-ask; `schema` is the
route's request schema.
"""

from proxy.protocols.responses.adapter import ResponsesProtocol
from proxy.protocols.responses.stream import ResponsesAssembly

__all__ = ["ResponsesAssembly", "ResponsesProtocol"]
