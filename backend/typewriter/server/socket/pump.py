"""One chat's events as protocol v1 frames, in the order they go out, for every socket chat and the gRPC door.
A token frame carries the ids of every token since the last one, held-back ones included, so that a client can
have the answer continued elsewhere token for token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ...engine.request import Finished, FinishReason, Queued, Started, Token
from ..calculator import NAME, ToolStep
from ..chats import ChatStream
from .frames import end, error, queued, start, token, tool_call, tool_step


@dataclass
class Outgoing:
    frame: dict[str, Any]
    ids: list[int] = field(default_factory=list)  # a token frame's: the token ids since the last token frame
    last: bool = False  # the chat's `end` or `error`


async def frames(stream: ChatStream) -> AsyncIterator[Outgoing]:
    ids: list[int] = []
    while True:
        event = await stream.next_event()
        if isinstance(event, Queued):
            yield Outgoing(queued(stream.chat_id, event.position))
        elif isinstance(event, Started):
            frame = start(stream.chat_id, event.prompt_tokens, event.cached_tokens, stream.dropped_messages)
            yield Outgoing(frame | {"continued": stream.continued} if stream.continued else frame)
        elif isinstance(event, Token):
            ids.append(event.token_id)
            if stream.shows(event):
                yield Outgoing(token(stream.chat_id, event.index, event.text), ids)
                ids = []
        elif isinstance(event, Finished):
            if event.reason is FinishReason.ERROR:
                yield Outgoing(error("internal", f"generation failed: {event.error}", stream.chat_id), last=True)
                return
            if event.reason is FinishReason.CONSTRAINT:  # the client's constraint: the message names its field
                yield Outgoing(error("invalid_request", event.error or "the answer's constraint could go no further",
                                     stream.chat_id), last=True)
                return
            calls = stream.tool_calls(event.request_id)
            for i, call in enumerate(calls):
                yield Outgoing(tool_call(stream.chat_id, i, call.call_id, call.name, call.arguments))
            yield Outgoing(end(stream.chat_id, event, bool(calls)), last=True)
            return
        elif isinstance(event, ToolStep):
            yield Outgoing(tool_step(stream.chat_id, event.index, NAME, event.expression, event.result, event.error))
        # a ToolCallDelta: each call goes out whole, before the end
