"""Every call on the gRPC port, whatever its service: while it runs its connection is busy, not waiting (guard.py),
and a stream (a chat, a health Watch, reflection) counts as a socket against the client's limits, as a WebSocket
does; a unary call (a health Check) answers at once, as /healthz does, and counts as none.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import grpc  # type: ignore[import-untyped, unused-ignore]

from ..identity import Identities
from ..limits import Limits, client_address
from .guard import Guard
from .service import Context, abort, text_metadata, when_done

Behaviour = Callable[[Any, Any], Any]


def client_of(context: Context, guard: Guard, trusted: frozenset[str]) -> str:
    """The call's client address: the proxied client's, or from a trusted proxy its `x-forwarded-for` metadata."""
    return client_address(guard.client(context.peer()), text_metadata(context), trusted)


class Calls(grpc.aio.ServerInterceptor):  # type: ignore[misc, type-arg, unused-ignore]  # generic in grpc-stubs only
    def __init__(self, guard: Guard, limits: Limits, identities: Identities):
        self.guard, self.limits, self.identities = guard, limits, identities

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        streaming = handler.request_streaming, handler.response_streaming
        make, behaviour = {(False, False): (grpc.unary_unary_rpc_method_handler, handler.unary_unary),
                           (True, False): (grpc.stream_unary_rpc_method_handler, handler.stream_unary),
                           (False, True): (grpc.unary_stream_rpc_method_handler, handler.unary_stream),
                           (True, True): (grpc.stream_stream_rpc_method_handler, handler.stream_stream)}[streaming]
        wrapped = self._unary(behaviour) if streaming == (False, False) else self._stream(behaviour)
        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def _unary(self, behaviour: Behaviour) -> Behaviour:
        async def unary(request: Any, context: Any) -> Any:
            await self._begin(context, counted=False)
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result

        return unary

    def _stream(self, behaviour: Behaviour) -> Behaviour:
        async def stream(request: Any, context: Any) -> Any:
            await self._begin(context, counted=True)
            result = behaviour(request, context)
            if inspect.isasyncgen(result):  # written here, so that this wrapper serves handlers of either kind
                async with contextlib.aclosing(result):
                    async for response in result:
                        await context.write(response)
                return None
            return await result if inspect.isawaitable(result) else result

        return stream

    async def _begin(self, context: Any, counted: bool) -> None:
        connection = self.guard.call_started(context.peer())
        client = self.identities.counted(client_of(context, self.guard, self.limits.trusted),
                                         text_metadata(context).get("authorization")) if counted else None
        refused = self.limits.connect(client) if client is not None else None

        def ended(_: object) -> None:
            self.guard.call_ended(connection)
            if client is not None and refused is None:
                self.limits.disconnect(client)

        when_done(context, ended)  # also when the call ends while its handler waits to send
        if refused:
            await abort(context, "overloaded", refused)
