"""A chat with tools: its answer's tokens split into text and tool calls, for every door. Calls arrive as
`ToolCallDelta`s the way OpenAI streams `delta.tool_calls`; the socket and gRPC send each call whole (`calls`).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from ..engine.request import Token
from ..text.tool_format import CallArguments, CallStarted, Piece, TextPiece, ToolCallParser, ToolFormat


@dataclass(frozen=True)
class ToolCallDelta:
    request_id: str
    index: int
    call_id: str
    name: str | None  # in the call's first delta only
    arguments: str  # the next piece of its arguments' JSON text ("" in the first delta)


@dataclass(frozen=True)
class ToolCallDone:
    call_id: str
    name: str
    arguments: str


class ToolCallSplitter:
    def __init__(self, request_id: str, fmt: ToolFormat):
        self.request_id = request_id
        self.parser = ToolCallParser(fmt)
        self.call_ids: list[str] = []

    def split(self, token: Token) -> list[Token | ToolCallDelta]:
        """The token with its text cut to what is not a call, then the call deltas it completed."""
        return self._events(token, self.parser.push(token.text))

    def flush(self, last: Token | None = None) -> list[Token | ToolCallDelta]:
        template = last or Token(self.request_id, 0, -1, "")
        return self._events(template, self.parser.flush())

    @property
    def calls(self) -> list[ToolCallDone]:
        return [ToolCallDone(call_id, c["name"], c["arguments"]) for call_id, c in zip(self.call_ids,
                                                                                      self.parser.calls)]

    def _events(self, token: Token, pieces: list[Piece]) -> list[Token | ToolCallDelta]:
        text = "".join(p.text for p in pieces if isinstance(p, TextPiece))
        out: list[Token | ToolCallDelta] = [dataclasses.replace(token, text=text)] if text else []
        for piece in pieces:
            if isinstance(piece, CallStarted):
                self.call_ids.append(f"call_{uuid.uuid4().hex[:24]}")
                out.append(ToolCallDelta(self.request_id, piece.index, self.call_ids[piece.index], piece.name, ""))
            elif isinstance(piece, CallArguments):
                out.append(ToolCallDelta(self.request_id, piece.index, self.call_ids[piece.index], None, piece.text))
        return out
