"""``POST /api/v1/scheduler``: the Mesos v1 scheduler HTTP API on the master.

A SUBSCRIBE answers 200 with a chunked RecordIO stream of JSON events and a ``Mesos-Stream-Id``
header; the stream is a peer of the master (see :mod:`agora.master.server.streams`), so the
scheduler's calls go through the same ACL and core, in order with everything else, and what the
core sends it comes back as events. Every other call names the framework and carries the stream
id, and is answered 202 once the core has taken it; what comes of it (offers, updates, errors)
arrives on the stream, as on Mesos. Hanging up the stream disconnects the framework (its
failover timeout starts); it subscribes again with its framework id to take it back.

Answers as Mesos gives them: 400 for a malformed call, a call naming an unknown framework, one
made as another principal than the framework's, a missing or wrong ``Mesos-Stream-Id``; 403 for
a framework not subscribed (or not over HTTP); 415 for protobuf (Agora serves JSON only); 406
when the client will not take JSON; 501 for calls Agora lacks; 307 from a standby to the leader
(503 while none is known). Authentication is the operator API's (bearer or Basic); a
SUBSCRIBE whose ``framework_info.principal`` is not the caller's is refused, and one left empty
gets the caller's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Final

import structlog
from agora.master.core import Master
from agora.master.core.frameworks import FAILED_OVER
from agora.master.server.http_access import PRINCIPAL
from agora.master.server.http_calls import SubmitFn
from agora.master.server.local_calls import NotActing
from agora.master.server.mesos_operator import MESOS_VERSION
from agora.master.server.streams import STREAM_PEER, Stream, Streams
from agora.sdk.errors import ProtocolError
from agora.sdk.mesos.executor_api import recordio
from agora.sdk.mesos.scheduler_api import (
    MAX_CALL_BYTES,
    SchedulerCall,
    Unsupported,
    events_to_mesos,
    scheduler_call_from_mesos,
)
from agora.sdk.messages import Error, Subscribe, Subscribed
from aiohttp import web
from msgspec.structs import replace

__all__ = ["add_routes"]

log = structlog.get_logger(__name__)

#: How often a waiting stream checks that its scheduler is still connected.
_LIVENESS_SECONDS: Final = 0.5
_PATHS: Final = ("/api/v1/scheduler", "/master/api/v1/scheduler")


def add_routes(
    app: web.Application,
    *,
    core: Callable[[], Master | None],
    streams: Streams,
    submit: SubmitFn,
    standby: Callable[[web.Request], web.StreamResponse | None],
    timeout: float = 10.0,
) -> None:
    """Serve the scheduler API on ``app``: ``submit`` makes the calls, ``standby(request)``
    answers instead while this master does not lead."""
    api = _SchedulerApi(core, streams, submit, standby, timeout)
    for path in _PATHS:
        app.router.add_post(path, api.handle)


class _SchedulerApi:
    def __init__(
        self,
        core: Callable[[], Master | None],
        streams: Streams,
        submit: SubmitFn,
        standby: Callable[[web.Request], web.StreamResponse | None],
        timeout: float,
    ) -> None:
        self._core = core
        self._streams = streams
        self._submit = submit
        self._standby = standby
        self._timeout = timeout

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.content_type == "application/x-protobuf":
            return _refuse(415, "Agora serves the Mesos scheduler API in JSON only")
        if request.content_type != "application/json":
            return _refuse(415, "Expecting 'Content-Type' of application/json")
        elsewhere = self._standby(request)
        if elsewhere is not None:
            return elsewhere
        body = await _body(request)
        if body is None:
            return _refuse(413, f"a call body is limited to {MAX_CALL_BYTES} bytes")
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return _refuse(400, f"Failed to parse body into JSON: {exc}")
        try:
            call = scheduler_call_from_mesos(value)
        except Unsupported as exc:
            return _refuse(501, str(exc))
        except ProtocolError as exc:
            return _refuse(400, f"Failed to validate scheduler::Call: {exc}")
        principal = request.get(PRINCIPAL)
        if call.kind == "SUBSCRIBE":
            return await self._subscribe(request, call, principal)
        return await self._call(request, call, principal)

    async def _call(
        self, request: web.Request, call: SchedulerCall, principal: str | None
    ) -> web.StreamResponse:
        core = self._core()
        if core is None:  # the lease lapsed between the standby check and now
            return _refuse(503, "this master cannot act now; retry")
        assert call.framework_id is not None
        fw = core.framework(call.framework_id)
        if fw is None:
            return _refuse(400, "Framework cannot be found")
        if principal is not None and principal != fw.info.principal:
            return _refuse(
                400,
                f"Authenticated principal '{principal}' does not match principal "
                f"'{fw.info.principal}' set in `FrameworkInfo`",
            )
        if not fw.connected or fw.peer is None:
            return _refuse(403, "Framework is not subscribed")
        if not fw.peer.startswith(STREAM_PEER):
            return _refuse(403, "Framework is not connected via HTTP")
        stream_id = request.headers.get("Mesos-Stream-Id")
        if stream_id is None:
            return _refuse(
                400, "All non-subscribe calls should include the 'Mesos-Stream-Id' header"
            )
        if STREAM_PEER + stream_id != fw.peer:
            return _refuse(
                400,
                f"The stream ID '{stream_id}' included in this request didn't match the "
                f"stream ID currently associated with framework ID {fw.framework_id}",
            )
        if call.message is not None:
            try:
                await self._submit(fw.peer, call.message, principal, self._timeout)
            except NotActing:
                return _refuse(503, "this master cannot act now; retry")
            except TimeoutError:
                return _refuse(504, "the master did not take the call in time; retry")
        return web.Response(status=202)

    async def _subscribe(
        self, request: web.Request, call: SchedulerCall, principal: str | None
    ) -> web.StreamResponse:
        if "Mesos-Stream-Id" in request.headers:
            return _refuse(400, "Subscribe calls should not include the 'Mesos-Stream-Id' header")
        accept = request.headers.get("Accept", "*/*")
        if not any(
            t.split(";")[0].strip() in ("application/json", "application/*", "*/*")
            for t in accept.split(",")
        ):
            return _refuse(406, "Expecting 'Accept' to allow 'application/json'")
        message = call.message
        assert isinstance(message, Subscribe)
        info = message.framework_info
        if principal is not None:
            if info.principal is not None and info.principal != principal:
                return _refuse(
                    400,
                    "Failed to validate scheduler::Call: Authenticated principal "
                    f"'{principal}' does not match principal '{info.principal}' set in "
                    "`FrameworkInfo`",
                )
            if info.principal is None:
                message = replace(message, framework_info=replace(info, principal=principal))
        stream = self._streams.open(principal)
        try:
            await self._submit(stream.peer, message, principal, self._timeout)
        except NotActing:
            self._streams.end(stream)
            return _refuse(503, "this master cannot act now; retry")
        except TimeoutError:
            self._streams.end(stream)
            return _refuse(504, "the master did not take the call in time; retry")
        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "application/json", "Mesos-Stream-Id": stream.stream_id},
        )
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            await self._pump(request, response, stream)
        except ConnectionError:
            pass
        finally:
            self._streams.end(stream)  # a no-op if the master ended it
        return response

    async def _pump(self, request: web.Request, response: web.StreamResponse, s: Stream) -> None:
        """Write what the core says to the stream's scheduler until either side ends it."""
        while True:
            try:
                message = await asyncio.wait_for(s.queue.get(), _LIVENESS_SECONDS)
            except TimeoutError:
                transport = request.transport
                if transport is None or transport.is_closing():
                    return  # the scheduler hung up
                continue
            if message is None:
                if s.ended is not None:
                    log.info("scheduler_stream_ended", stream_id=s.stream_id, reason=s.ended)
                return
            if isinstance(message, Subscribed):
                s.framework_id = message.framework_id
            for event in events_to_mesos(message, version=MESOS_VERSION):
                await response.write(recordio(event))
            if isinstance(message, Error) and (
                s.framework_id is None or message.message == FAILED_OVER
            ):
                # The subscription was refused, or another scheduler took the framework over:
                # Mesos sends the error and closes the stream.
                return


async def _body(request: web.Request) -> bytes | None:
    """The whole request body (None: longer than :data:`MAX_CALL_BYTES`)."""
    if request.content_length is not None and request.content_length > MAX_CALL_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):
        size += len(chunk)
        if size > MAX_CALL_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _refuse(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain")
