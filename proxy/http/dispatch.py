"""The one dispatch path of the turn routes (`POST /v1/chat/completions`, `/v1/responses`, …).

A `TurnRoute` is a plain ASGI app: it binds the request id for every log event of the request,
checks the key, reads and parses the body, begins the turn, drives it plain or streamed, and
answers; an error is answered here and nowhere else, and a request refused before its turn
began (400, 401, 404, 413) is counted and logged here, once.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Final

import orjson
import structlog
from pydantic import TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy import tracing
from proxy.errors import BadRequestError, SessionStoreError, ToolsentryError, status_of
from proxy.guard.channels import Channel
from proxy.http.auth import Keys
from proxy.http.body import read_body
from proxy.http.disconnect import DisconnectWatch, DisconnectWatches
from proxy.http.jsonbody import BodyParser
from proxy.http.replies import JSONReply, SSEReply, request_headers
from proxy.logs import get_logger
from proxy.pipeline.gate import Pipeline
from proxy.pipeline.plain import complete
from proxy.pipeline.stream import open_stream
from proxy.pipeline.turn import Exchange
from proxy.protocols.base import WireProtocol
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.tracing import RequestTrace

UPSTREAM_ERROR = Channel.UPSTREAM_ERROR.value
_CLIENT_GONE = 499  # nginx's status for a request whose client closed its connection first
_INTERNAL = "internal error in toolsentry; see the proxy's log"


class TurnRoute:
    """Serves one wire protocol's route through the turn (an ASGI app)."""

    def __init__(self, pipeline: Pipeline, protocol: WireProtocol, keys: Keys) -> None:
        self.pipeline = pipeline
        self.protocol = protocol
        self.bodies = BodyParser(
            pipeline.limits, compile=protocol.compile_tools, resent=protocol.resent
        )
        self.keys = keys
        self.watches = DisconnectWatches()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = request_headers(scope)
        # 32 random hex digits, as uuid4().hex gave, without building a UUID (a few µs).
        request_id = headers.get("x-request-id") or os.urandom(16).hex()
        tokens = structlog.contextvars.bind_contextvars(request_id=request_id)
        tracing = self.pipeline.tracing
        trace = traced = None
        if tracing is not None:
            trace = tracing.request(
                api=self.protocol.api,
                model="",
                method=scope["method"],
                route=scope["path"],
                headers=headers,
                stream=False,
            )
            traced = CURRENT_TRACE.set(trace)
        status = 200
        watch = self.watches.watch()
        try:
            query = scope.get("query_string", b"").decode("latin-1")
            exchange = Exchange(self.protocol.api, time.perf_counter(), query=query)
            try:
                response = await self._answer(headers, receive, exchange, watch)
            except ClientDisconnect:
                return  # gone before its request was read: nobody to answer
            except asyncio.CancelledError:
                if not watch.gone:
                    raise
                # Gone while its answer was awaited: the upstream request is cancelled (its
                # connection closed), the turn closed as a client's leaving, nothing answered.
                task = asyncio.current_task()
                assert task is not None
                task.uncancel()
                status = _CLIENT_GONE
                await self._failed(exchange, _CLIENT_GONE, "client_disconnected")
                return
            except ToolsentryError as exc:
                if isinstance(exc, SessionStoreError) and exchange.turn is None:
                    self.pipeline.store_failed(exc, api=self.protocol.api, phase="begin")
                await self._failed(exchange, status_of(exc), exc.error_type)
                body = self.protocol.error(exc)
                response = JSONReply(orjson.dumps(body), status_of(exc), exc.headers)
            except Exception as exc:
                # Never a traceback to the client; the log has it.
                get_logger().error(
                    "unhandled_error", path=scope["path"], error=repr(exc), exc_info=exc
                )
                await self._failed(exchange, 500, "internal_error")
                body = self.protocol.error(ToolsentryError(_INTERNAL))
                response = JSONReply(orjson.dumps(body), 500)
            status = response.status_code
            await response(scope, receive, send)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)
            if trace is not None and traced is not None:
                # After the response is sent: a stream's span ends with the stream.
                CURRENT_TRACE.reset(traced)
                _finish_trace(trace, exchange, status)

    async def _answer(
        self, headers: dict[str, str], receive: Receive, exchange: Exchange, watch: DisconnectWatch
    ) -> Response:
        """The request's answer. From its body's end until the answer is made, a client that
        leaves cancels this (`watch`); a stream's reply goes on watching until it ends."""
        exchange.key = self.keys.require_client(headers)
        raw = await read_body(headers, receive, self.pipeline.settings.max_body_bytes)
        watch.start(receive)
        try:
            parsed = self.bodies.parse(raw)
            read_flags(parsed.body)
            exchange.model = parsed.body.get("model")
            trace = CURRENT_TRACE.get()
            if trace is not None and isinstance(exchange.model, str):
                trace.name(exchange.model)  # before any upstream try, so each is named for it
            turn = await self.pipeline.begin(
                self.protocol, parsed.body, headers, exchange, index=parsed.index
            )
            if turn.view.stream:
                return SSEReply(await open_stream(turn, raw=raw), watch)
            result = await complete(turn, raw=raw)
        except BaseException:
            watch.stop()
            raise
        watch.stop()
        return JSONReply(result.content(), result.status, result.headers)

    async def _failed(self, exchange: Exchange, status: int, error: str) -> None:
        """Account a request that ended in an error: its turn's close, or a refusal's count."""
        turn = exchange.turn
        if turn is None:
            self.pipeline.refused(exchange, status, error)
        elif not turn.closed:
            await turn.close(status)  # a store failing there is counted, logged, not raised


_LAX_BOOL: TypeAdapter[bool | None] = TypeAdapter(bool | None)


# The booleans the proxy itself reads from a request body, by path: each must mean to the proxy
# what it means to the upstream.
_FLAGS: Final = (("stream",), ("stream_options", "include_usage"))


def read_flags(body: dict[str, Any]) -> None:
    """Read each boolean the proxy acts on (`stream`, `stream_options.include_usage`) as the
    upstream does when it is not a JSON boolean: vLLM's request models of all three protocols
    declare them `bool | None` and validate in pydantic's lax mode, where "false", "0", "no" and
    "off" are false and "true", "1", "yes" and "on" true; anything else is refused with 400, as
    the upstream would. The body keeps each flag as a boolean, so the proxy streams (and adds a
    usage chunk) exactly when the upstream does. Raises BadRequestError."""
    for path in _FLAGS:
        holder: Any = body
        for key in path[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if not isinstance(holder, dict):
            continue
        flag = holder.get(path[-1])
        if flag is None or flag is True or flag is False:
            continue
        name = ".".join(path)
        try:
            holder[path[-1]] = bool(_LAX_BOOL.validate_python(flag))
        except ValidationError:
            raise BadRequestError(
                f"'{name}' must be a boolean, got {orjson.dumps(flag)[:64].decode()}", param=name
            ) from None


def _finish_trace(trace: RequestTrace, exchange: Exchange, status: int) -> None:
    """End the request's server span with what its turn reported (the turn's status wins: a
    stream that broke off after its 200 reports the error it ended in)."""
    turn = exchange.turn
    if turn is None or not turn.closed:
        trace.finish(status, {})
        return
    report = turn.report()
    trace.finish(
        report.status,
        {
            tracing.STREAM: bool(turn.view.stream),
            tracing.CONVERSATION: report.session,
            tracing.SESSION_ERRORS: report.errors,
            tracing.SESSION_MAX_ERRORS: report.max_errors,
            tracing.SESSION_EXHAUSTED: report.errors >= report.max_errors,
            tracing.REPAIRS: report.repairs,
            tracing.VIOLATIONS: list(report.violations) or None,
        },
        error=UPSTREAM_ERROR if UPSTREAM_ERROR in report.violations else None,
    )


class Delegate(Response):
    """A response that hands the request to an ASGI app: what FastAPI's registration of a turn
    route answers with, so that also with middleware or a root path it runs the one dispatch."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
