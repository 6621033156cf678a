"""Continue anywhere: a chat that brings the start of its answer (`continue`) is submitted so that the engine goes
on after it, as the same assistant turn (engine/request_state.py replays it).

The start is taken as the token ids the client kept when they stream exactly the text it shows on this server's
tokenizer: then the model reads what it wrote, token for token, and a greedy or seeded answer goes on as if it had
never been cut. Otherwise (no ids, or ids from another model or tokenizer, as during a rolling upgrade) the text
is encoded here: a coherent continuation, which may differ from the uninterrupted answer where the encoding parts
from what the model generated.
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
    """Submit `request`, continuing `start` if given; returns EXACT, ENCODED or None. Raises what
    `Engine.submit` raises."""
    if start is None:
        engine.submit(request, on_event)
        return None
    if start.ids is not None:
        try:
            engine.submit(dataclasses.replace(request, answer_start=AnswerStart(start.ids, start.text)), on_event)
            return EXACT
        except InvalidRequest as e:
            if e.field != "continue.ids":
                raise
            log.info("chat %s: %s; continuing from its text instead", request.id, e)
    ids = await asyncio.to_thread(tokenizer.encode, start.text)
    engine.submit(dataclasses.replace(request, answer_start=AnswerStart(tuple(ids))), on_event)
    return ENCODED
