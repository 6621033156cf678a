"""A chat that brings the start of its answer (`continue`) goes on after it. The client's token ids are taken when
they stream exactly its text here, so that a seeded answer goes on as if never cut; otherwise the text is encoded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from ...engine.request import AnswerStart, Event, GenerationRequest
from ...errors import InvalidRequest
from ..chat_request import Continue
from ..lifecycle import ChatEncoder, EngineHandle

log = logging.getLogger("typewriter.server")

EXACT, ENCODED = "ids", "text"  # how the start was taken, as the start frame's `continued` says


async def submit(engine: EngineHandle, tokenizer: ChatEncoder, request: GenerationRequest, start: Continue | None,
                 on_event: Callable[[Event], None]) -> str | None:
    """Returns EXACT, ENCODED or None (no start); raises what `Engine.submit` raises."""
    if start is None:
        engine.submit(request, on_event)
        return None
    if control := sorted(set(start.ids or ()) & {*tokenizer.special_ids, *tokenizer.eos_token_ids}):
        raise InvalidRequest("continue.ids", f"{control[0]} names a control token, which no answer's text holds; "
                                             "send the ids of the answer's text only")
    room = engine.max_context - len(request.prompt_ids)  # read no further than that: a huge start costs no more
    if await asyncio.to_thread(tokenizer.count, start.text, room) > room:
        raise InvalidRequest("continue.text", f"the answer's start is longer than the {room} tokens the context "
                                              "leaves after the conversation; ask again instead of continuing")
    if start.ids is not None:
        try:
            engine.submit(dataclasses.replace(request, answer_start=AnswerStart(start.ids, start.text)), on_event)
            return EXACT
        except InvalidRequest as e:
            if e.field != "continue.ids":
                raise
            log.info("chat %s: %s; continuing from its text instead", request.id, e)
    ids = await asyncio.to_thread(tokenizer.encode_text, start.text)
    engine.submit(dataclasses.replace(request, answer_start=AnswerStart(tuple(ids))), on_event)
    return ENCODED
