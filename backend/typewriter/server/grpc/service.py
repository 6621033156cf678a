"""The gRPC door: `typewriter.v1.Chat/Stream` (docs/grpc.md). One RPC is one chat, read by protocol v1's own rules
and answered from the socket's own frames, so that both doors say the same thing; a refusal's protocol v1 code
travels in the trailing metadata `typewriter-error-code`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeAlias

import grpc  # type: ignore[import-untyped, unused-ignore]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped, unused-ignore]

from .. import chat_request
from ..auth import bearer
from ..chat_request import Chat
from ..chats import Cancel, ChatStream, StreamState, open_chat
from ..identity import Identity
from ..lifecycle import Phase, ServerState
from ..owners import CONVERSATION_KEY
from ..refusal import Refusal
from ..socket.pump import frames
from .gen import chat_pb2 as pb
from .gen import chat_pb2_grpc

log = logging.getLogger("typewriter.server")

Incoming: TypeAlias = "pb.ClientMessage | Unreadable"
Context: TypeAlias = "grpc.aio.ServicerContext[Incoming, pb.ServerEvent]"

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Chat"].full_name
ERROR_CODE_KEY = "typewriter-error-code"  # trailing metadata: the protocol v1 code of a refusal or failure
RETRY_AFTER_KEY = "retry-after"  # trailing metadata of rate_limited: seconds until a chat would be taken
UNAUTHORIZED = "unauthorized"

Status = grpc.StatusCode
STATUS = {
    "invalid_json": Status.INVALID_ARGUMENT,
    "invalid_request": Status.INVALID_ARGUMENT,
    "system_prompt_not_allowed": Status.INVALID_ARGUMENT,
    "prompt_too_long": Status.INVALID_ARGUMENT,
    "busy": Status.FAILED_PRECONDITION,
    "overloaded": Status.RESOURCE_EXHAUSTED,
    "not_found": Status.NOT_FOUND,
    "rate_limited": Status.RESOURCE_EXHAUSTED,
    "shutdown": Status.UNAVAILABLE,
    "internal": Status.INTERNAL,
    "not_supported": Status.UNIMPLEMENTED,
    UNAUTHORIZED: Status.UNAUTHENTICATED,
}


class ChatService(chat_pb2_grpc.ChatServicer):
    """`client(context)` is the call's client address; its stream is counted as a socket before it comes here
    (calls.py). The call's `authorization` metadata names its client as the header does on HTTP."""

    def __init__(self, state: ServerState, client: Callable[[Context], str]):
        self.server = state
        self.client = client

    async def Stream(self, requests: AsyncIterator[Incoming], context: Context) -> AsyncIterator[pb.ServerEvent]:
        metadata = text_metadata(context)
        await self._admit(metadata, context)
        client = self.server.identities.resolve(self.client(context), metadata.get("authorization"))
        if client is None:
            await abort(context, UNAUTHORIZED, "this server serves its classes only: send your class's key as the "
                                               "metadata 'authorization: Bearer <key>'")
            return
        try:
            async for event in self._chat(requests, context, client, metadata.get(CONVERSATION_KEY)):
                yield event
        except Refusal as e:
            self.server.metrics.rejected.labels(code=e.code).inc()
            await abort(context, e.code, e.message, e.retry_after_s)

    async def _admit(self, metadata: Mapping[str, str], context: Context) -> None:
        key = self.server.settings.access.api_key
        if key:
            given = bearer(metadata.get("authorization"))
            if given is None or not (hmac.compare_digest(given.encode(), key.encode())
                                     or self.server.classes.by_key(given) is not None):
                await abort(context, UNAUTHORIZED, "this server needs its API key: send the metadata "
                                                   "'authorization: Bearer <key>' (TYPEWRITER_API_KEY on the server)")
        if self.server.phase is Phase.STOPPING:
            await abort(context, "shutdown", "the server is shutting down; reconnect in a moment")
        if not self.server.ready:
            reason = ("the model is still loading; retry when the health service says SERVING (or /readyz is 200)"
                      if self.server.phase is Phase.LOADING else "the server is not serving chats; see /readyz")
            await context.abort(Status.UNAVAILABLE, reason)  # no protocol code: the socket's close 1013

    async def _chat(self, requests: AsyncIterator[Incoming], context: Context, client: Identity,
                    key: str | None) -> AsyncIterator[pb.ServerEvent]:
        first = await anext(aiter(requests), None)
        if isinstance(first, Unreadable):
            raise first.error(None)
        if first is not None and first.WhichOneof("kind") == "stop":
            raise Refusal("not_found", "no chat is running on this stream: send the chat first",
                                  first.stop.id or None)
        if first is None or first.WhichOneof("kind") != "chat":
            raise Refusal("invalid_request", "a stream's first message must be a chat request")
        chat = chat_of(first.chat, self.server.settings.socket.max_messages)
        owner, key = self.server.owners.of_request(client, key)
        stream = await open_chat(self.server, chat, client, owner, self.server.settings.answers.api_system_prompt)
        await context.send_initial_metadata(((CONVERSATION_KEY, key),))
        reader = asyncio.create_task(self._read(requests, stream), name=f"grpc-read-{stream.engine_id}")

        def gone(_: object = None) -> None:  # the RPC ended: at once when it is cancelled, whatever the handler awaits
            reader.cancel()
            if stream.state is not StreamState.ENDED:
                stream.cancel(Cancel.DISCONNECT)
                stream.end()

        when_done(context, gone)
        try:
            async for out in frames(stream):
                refusal = reader.result() if reader.done() else None  # it ends the RPC once the chat ended
                if out.last:
                    stream.end()
                    if refusal is not None:
                        raise refusal
                    if out.frame["type"] == "error":
                        await abort(context, out.frame["code"], out.frame["message"])
                if refusal is None or out.last:
                    yield server_event(out.frame)
                if out.last:
                    return
        finally:
            gone()

    async def _read(self, requests: AsyncIterator[Incoming], stream: ChatStream) -> Refusal | None:
        """A stop stops the chat; anything else cancels it and returns the error that ends the RPC."""
        chat_id = stream.chat_id
        try:
            async for message in requests:
                kind = message.WhichOneof("kind")
                if isinstance(message, Unreadable):
                    stream.cancel(Cancel.DISCONNECT)
                    return message.error(chat_id)
                if kind == "stop" and message.stop.id in ("", chat_id):
                    if stream.cancelled is None:  # a flood of stops costs the engine nothing
                        stream.cancel(Cancel.STOP)
                    continue
                if kind == "stop":
                    error = Refusal("not_found", f"no chat with id {message.stop.id!r} is running on this "
                                                         f"stream (its chat is {chat_id!r})", message.stop.id)
                elif kind == "chat":
                    error = Refusal("busy", f"chat {chat_id!r} is running on this stream: a stream carries "
                                                    "one chat; open another stream", message.chat.id or None)
                else:
                    error = Refusal("invalid_request", "a message must carry a chat or a stop", chat_id)
                stream.cancel(Cancel.DISCONNECT)
                return error
        except grpc.RpcError as e:  # the call broke; the handler hears of it from gRPC
            log.debug("chat %s: reading its stream failed: %s", stream.engine_id, e)
        return None


class Unreadable:
    """A message that does not decode: refused with `invalid_request` rather than gRPC's bare UNKNOWN."""

    def __init__(self, reason: str):
        self.reason = reason

    def WhichOneof(self, _: str) -> None:
        return None

    def error(self, chat_id: str | None) -> Refusal:
        return Refusal("invalid_request", f"the message is not a typewriter.v1.ClientMessage: {self.reason} "
                                                  "(strings must be UTF-8 text)", chat_id)


def read_message(data: bytes) -> Incoming:
    try:
        message: pb.ClientMessage = pb.ClientMessage.FromString(data)
    except DecodeError as e:
        return Unreadable(str(e))
    return message


def add_to_server(service: ChatService, server: grpc.aio.Server) -> None:
    """chat_pb2_grpc.add_ChatServicer_to_server, with `read_message` reading what clients send."""
    handlers = {"Stream": grpc.stream_stream_rpc_method_handler(
        service.Stream, request_deserializer=read_message, response_serializer=pb.ServerEvent.SerializeToString)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(  # type: ignore[attr-defined, unused-ignore]  # newer than grpc-stubs
        SERVICE_NAME, handlers)


def chat_of(request: pb.ChatRequest, max_messages: int) -> Chat:
    """The request as protocol v1's `chat` frame, checked by its rules; unset params are not given."""
    params = {field.name: list(value) if field.is_repeated else value
              for field, value in request.params.ListFields()}
    frame = {"type": "chat", "id": request.id, "params": params,
             "messages": [_message(m) for m in request.messages]}
    if request.HasField("response_format"):
        frame["response_format"] = _response_format(request.id, request.response_format)
    if request.tools:
        frame["tools"] = [{"type": "function", "function": _tool(request.id, i, t)}
                          for i, t in enumerate(request.tools)]
    if request.tool_choice:
        choice = request.tool_choice
        frame["tool_choice"] = choice if choice in ("none", "auto", "required") else \
            {"type": "function", "function": {"name": choice}}
    return chat_request.parse_chat(frame, max_messages)


def _message(m: pb.Message) -> dict[str, Any]:
    message: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        message["tool_calls"] = [{"id": c.call_id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
    if m.tool_call_id:
        message["tool_call_id"] = m.tool_call_id
    return message


def _response_format(chat_id: str, f: pb.ResponseFormat) -> dict[str, Any]:
    if f.type == "json_schema":
        schema = _json(chat_id, "response_format.schema_json", f.schema_json or "{}")
        return {"type": "json_schema", "json_schema": {"name": f.name, "schema": schema, "strict": f.strict}}
    if f.type in ("regex", "grammar"):
        return {"type": f.type, f.type: f.regex if f.type == "regex" else f.grammar}
    return {"type": f.type}


def _tool(chat_id: str, i: int, tool: pb.Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    if tool.parameters_json:
        function["parameters"] = _json(chat_id, f"tools[{i}].parameters_json", tool.parameters_json)
    return function


def _json(chat_id: str, where: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise Refusal("invalid_request", f"{where}: not JSON text ({e})", chat_id) from None


def server_event(frame: dict[str, Any]) -> pb.ServerEvent:
    """A protocol v1 frame as its message: `type` names the oneof field, the other fields keep their names."""
    fields = dict(frame)
    kind, chat_id = fields.pop("type"), fields.pop("id")
    return pb.ServerEvent(id=chat_id, **{kind: fields})


def peer_address(peer: str) -> str | None:
    """The IP address in gRPC's peer string ('ipv4:127.0.0.1:5123', 'ipv6:[::1]:5123'); None for others."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    return rest.rpartition(":")[0].strip("[]") or None


def text_metadata(context: Context) -> dict[str, str]:
    """Binary values come only under keys ending in -bin, and none of those is read."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


def when_done(context: Context, callback: Callable[[object], None]) -> None:
    """grpc-stubs types the callback as a class (DoneCallback), not the callable gRPC calls."""
    context.add_done_callback(callback)  # type: ignore[arg-type, unused-ignore]


async def abort(context: Context, code: str, message: str,
                retry_after_s: float | None = None) -> None:
    """Raises, as `context.abort` does; `retry-after` is in whole seconds, as in HTTP."""
    metadata = [(ERROR_CODE_KEY, code)]
    if retry_after_s is not None:
        metadata.append((RETRY_AFTER_KEY, str(max(1, math.ceil(retry_after_s)))))
    await context.abort(STATUS[code], f"{code}: {message}", trailing_metadata=tuple(metadata))
