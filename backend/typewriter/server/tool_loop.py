"""An answer that may use the server's calculator (calculator.py), run as parts: engine requests one after another.
A part ends where a call is complete (a model that writes on after it would make up the result), or by itself; then
each of its calls is evaluated and shown as a step, the calls and their results join the conversation, and the next
part goes on from there. The owner's slot still holds the conversation, so only the calls and their results are
computed again, where the slot is still free.

To its door the parts are one answer: one `Queued`/`Started` at most, token indices that keep counting, the steps
between the text, and one `Finished` whose usage sums the parts. It is bounded over all parts: MAX_STEPS calculations,
the chat's `max_new_tokens` and its deadline. A stop or a disconnect ends it between parts as within one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..engine.request import Finished, FinishReason, GenerationRequest, Queued, Started, Timings, Token
from ..errors import EngineStopped, TypewriterError
from ..text.tool_format import FENCED_JSON, TextPiece, ToolCallParser, ToolFormat
from .calculator import MAX_STEPS, NAME, ToolStep, call_arguments, over_limit, step
from .tool_calls import ToolCallDone

log = logging.getLogger("typewriter.server")

NATURAL = (FinishReason.EOS, FinishReason.STOP_SEQUENCE)  # a part that ended of itself, not cut short
Item = Queued | Started | Token | Finished | ToolStep
Encode = Callable[[list[dict[str, Any]]], list[int]]  # a conversation as the prompt, system prompt and tool included


class Answer(Protocol):
    """What the loop needs of its chat (chats.py's ChatStream)."""

    @property
    def cancelled(self) -> object: ...  # None while nobody asked it to end

    def put(self, items: Sequence[Item]) -> None: ...  # on to the door
    def submit(self, request: GenerationRequest) -> None: ...  # to the engine, its events back through `take`
    def cut(self, engine_id: str) -> None: ...  # end that part within a step (the answer is not cancelled)


class CallReader:
    """A part's text with the calculator's calls taken out: calls in the template's format, and calls of the
    calculator in a ```json block, as Qwen2.5-Coder models write them unforced (any other block is text)."""

    def __init__(self, fmt: ToolFormat):
        self.parsers = [ToolCallParser(fmt), ToolCallParser(FENCED_JSON, frozenset({NAME}))]
        self.ids: list[str] = []

    @property
    def found(self) -> int:
        return sum(len(parser.calls) for parser in self.parsers)

    def push(self, text: str) -> str:
        for parser in self.parsers:
            text = "".join(p.text for p in parser.push(text) if isinstance(p, TextPiece))
        return text

    def flush(self) -> str:
        text = ""
        for parser in self.parsers:
            text = "".join(p.text for p in [*parser.push(text), *parser.flush()] if isinstance(p, TextPiece))
        return text

    @property
    def calls(self) -> list[ToolCallDone]:
        found = [call for parser in self.parsers for call in parser.calls]
        self.ids += [f"call_{uuid.uuid4().hex[:24]}" for _ in range(len(found) - len(self.ids))]
        return [ToolCallDone(i, c["name"], c["arguments"]) for i, c in zip(self.ids, found)]


class ToolLoop:
    def __init__(self, answer: Answer, fmt: ToolFormat, first: GenerationRequest, messages: list[dict[str, Any]],
                 encode: Encode, context: int, next_id: Callable[[], str],
                 shared: Callable[[list[int]], tuple[int, ...]]):
        """`first`: the first part's request, whose id the door knows; `messages`: its conversation as fitted to the
        context; `shared`: how much of a prompt every owner shares (GenerationRequest.shared_prefix)."""
        self.answer, self.fmt, self.first = answer, fmt, first
        self.request_id = self.engine_id = first.id  # the door's id; the part running now
        self.messages, self.encode, self.context = list(messages), encode, context
        self.next_id, self.shared = next_id, shared
        self.parts: list[Finished] = []
        self.written = 0  # the ended parts' tokens: a running part's indices follow them
        self.steps = 0
        self.began = time.monotonic()
        self.started_at: float | None = None  # when the first part got its slot: the deadline counts from there
        self.task: asyncio.Task[None] | None = None
        self._new_part()

    def _new_part(self) -> None:
        self.reader = CallReader(self.fmt)
        self.text: list[str] = []  # the part's text outside its calls
        self.last: Token | None = None
        self.cutting = False  # a call is complete: the part's later tokens are never shown

    def take(self, event: Queued | Started | Token | Finished) -> list[Item]:
        """What one engine event of the running part becomes for the door; on the event loop."""
        if event.request_id != self.engine_id:
            return []
        if isinstance(event, (Queued, Started)):
            if isinstance(event, Started) and self.started_at is None:
                self.started_at = time.monotonic()
            return [] if self.parts else [dataclasses.replace(event, request_id=self.request_id)]
        if isinstance(event, Token):
            if self.cutting:
                return []
            self.last = dataclasses.replace(event, request_id=self.request_id,
                                            index=event.index + self.written)
            shown = self._shown(self.last, self.reader.push(event.text))
            if self.reader.found:
                self.cutting = True
                self.answer.cut(self.engine_id)
            return shown
        shown = [] if self.cutting else self._shown(self.last or Token(self.request_id, 0, -1, ""), self.reader.flush())
        self.parts.append(event)
        self.written += event.completion_tokens
        calls = self.reader.calls
        stopped = self.answer.cancelled is not None
        ended = event.reason in NATURAL or (self.cutting and event.reason is FinishReason.CANCELLED and not stopped)
        if not calls or not ended or stopped or self.steps >= MAX_STEPS:
            reason = FinishReason.EOS if ended and event.reason is FinishReason.CANCELLED else event.reason
            return [*shown, self._end(reason, event.error)]
        steps = [step(self.request_id, self.steps + i, call) if self.steps + i < MAX_STEPS else
                 over_limit(self.request_id, self.steps + i, call) for i, call in enumerate(calls)]
        self.steps += len(steps)
        self.task = asyncio.get_running_loop().create_task(self._next_part(calls, steps),
                                                           name=f"tool-loop-{self.request_id}")
        return [*shown, *steps]

    def _shown(self, token: Token, text: str) -> list[Item]:
        """The token with the text around calls; the calls themselves are the server's, never the client's."""
        if not text:
            return []
        self.text.append(text)
        return [dataclasses.replace(token, text=text)]

    async def _next_part(self, calls: list[ToolCallDone], steps: list[ToolStep]) -> None:
        try:
            await self._submit_next(calls, steps)
        except Exception:  # a bug: the answer ends, named, rather than hanging
            log.exception("chat %s: its next part after a calculator step could not start", self.request_id)
            self.answer.put([self._end(FinishReason.ERROR, "the answer could not go on after a calculator step")])

    async def _submit_next(self, calls: list[ToolCallDone], steps: list[ToolStep]) -> None:
        self.messages += [
            {"role": "assistant", "content": "".join(self.text).strip(), "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.name,
                                                                    "arguments": call_arguments(c.arguments)}}
                for c in calls]},
            *({"role": "tool", "content": s.for_model(), "tool_call_id": c.call_id} for c, s in zip(calls, steps))]
        prompt = await asyncio.to_thread(self.encode, self.messages)
        params = self.first.params
        room = min(params.max_new_tokens - self.written, self.context - len(prompt))
        left_s = None if params.timeout_s is None else \
            params.timeout_s - (time.monotonic() - (self.started_at or self.began))
        if self.answer.cancelled is not None:
            self.answer.put([self._end(FinishReason.CANCELLED)])
        elif room < 1:
            self.answer.put([self._end(FinishReason.LENGTH)])
        elif left_s is not None and left_s <= 0:
            self.answer.put([self._end(FinishReason.TIMEOUT)])
        else:
            self.engine_id = self.next_id()  # before the submit: a stop from here on reaches the new part
            self._new_part()
            request = dataclasses.replace(self.first, id=self.engine_id, prompt_ids=prompt, follows=None,
                                          answer_start=None, shared_prefix=self.shared(prompt),
                                          params=dataclasses.replace(params, max_new_tokens=room, timeout_s=left_s))
            try:
                self.answer.submit(request)
            except EngineStopped:
                self.answer.put([self._end(FinishReason.SHUTDOWN)])
            except TypewriterError as e:  # overloaded: the wait queue is full
                self.answer.put([self._end(FinishReason.ERROR, str(e))])

    def _end(self, reason: FinishReason, error: str | None = None) -> Finished:
        """The answer's one `Finished`: every part's tokens, and timings from its submission to now."""
        parts = self.parts
        if len(parts) == 1 and reason is parts[0].reason:  # one part: the engine's own figures
            return dataclasses.replace(parts[0], request_id=self.request_id)
        completion = sum(p.completion_tokens for p in parts)
        decode_s = sum(max(0.0, p.timings.total_ms - p.timings.ttft_ms) for p in parts) / 1000
        first = parts[0].timings
        timings = Timings(queue_ms=first.queue_ms, ttft_ms=first.ttft_ms,
                          total_ms=(time.monotonic() - self.began) * 1000,
                          tokens_per_s=max(0, completion - len(parts)) / decode_s if decode_s > 0 else 0.0)
        return Finished(self.request_id, reason, sum(p.prompt_tokens for p in parts), completion, timings, error)
