"""A scripted model runner for the real Engine: no TensorFlow, every answer known in advance.

`ChainRunner` is an engine `Runner` (engine/runner.py) whose calls are separate, as the XLA runner's are, with a
`compiler` that can hold back what is not "compiled" yet; `OnePassChainRunner` takes a whole step in one call, as
the int8-lite runner does. The next token is `follow(last token)`, so an answer is a chain.
Two scripts:
- `letters`: over the tiny byte-level tokenizer, a lowercase letter is followed by the next one ("a" -> "bcd...");
- `ScriptTokenizer` + `script_runner`: the answer to any prompt is a fixed list of text pieces, then eos.

Faults are injected on purpose (`fail(kind, error)`), so the engine's real failure paths are what tests see.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np
from tiny_model import IM_END, VOCAB_SIZE, byte_token

from typewriter.engine.capacity import Sizing
from typewriter.engine.engine import Engine
from typewriter.engine.runner import StepOutput, step_call_by_call
from typewriter.text.tool_format import GENERIC, HERMES


class ChainCompiler:
    """Like the XLA runner's compiler while it compiles in the background: runs only up to `compiled_up_to`."""

    def __init__(self, runner: ChainRunner):
        self.runner = runner
        self.warm_up_s = 0.0
        self.compiled_up_to: dict[str, int] = {}  # kind -> the longest length its compiled programs reach

    def status(self) -> dict:
        return {"compiled": 3, "total": 3, "compiling": []}

    def prepare_answer(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self.runner.calls.append(("prepare", prompt_tokens, max_new_tokens))

    def can_run(self, kind: str, n: int, length: int) -> bool:
        return length <= self.compiled_up_to.get(kind, self.runner.max_len)


class ChainRunner:
    def __init__(self, follow: Callable[[int], int], vocab_size: int, slots: int = 2, max_len: int = 64,
                 max_chunk: int = 16, step_s: float = 0.0):
        self.follow, self.vocab_size = follow, vocab_size
        self.slots, self.max_len, self.max_chunk = slots, max_len, max_chunk
        self.step_s = step_s  # a decode step's duration, for tests of a threaded engine
        self.failures: dict[str, list[BaseException]] = {"copy": [], "extend": [], "decode": []}
        self.calls: list[tuple] = []  # ("prefill", slot, start, n) / ("copy", source, target) / ("decode", slots)
        # What each slot's cache holds, position by position: every call is checked against it, so a
        # scheduling bug (a gap, a stale prefix, a wrong position) fails loudly instead of passing silently.
        self.cache: list[list[int]] = [[] for _ in range(slots)]
        self.compiler = ChainCompiler(self)
        self.sizing = Sizing(slots, "set")
        self.step_model = None
        self.checks_drafts = False  # a call per chunk gives only its last logits

    def describe(self) -> dict:
        return {"name": "scripted", "weights": "none", "programs": self.compiler.status()}

    def close(self) -> None:
        pass

    def step(self, slots, tokens, positions, chunks=()) -> StepOutput:
        return step_call_by_call(self, slots, tokens, positions, chunks)

    def logits_after(self, token: int) -> np.ndarray:
        row = np.zeros(self.vocab_size, np.float32)
        row[self.follow(token)] = 100.0  # certain under any sampling settings a test uses
        return row

    def fail(self, kind: str, error: BaseException, times: int = 1) -> None:
        """The next `times` calls of `kind` ("copy", "extend" or "decode") raise `error` before doing anything."""
        self.failures[kind] += [error] * times

    def _maybe_fail(self, kind: str) -> None:
        if self.failures[kind]:
            error = self.failures[kind].pop(0)
            raise type(error)(*error.args)  # a fresh one each time, so no traceback grows across calls

    def extend(self, slot: int, start: int, token_ids: Sequence[int]) -> np.ndarray:
        self._maybe_fail("extend")
        assert 0 < len(token_ids) <= self.max_chunk, f"a chunk of {len(token_ids)} tokens"
        assert start <= len(self.cache[slot]), f"slot {slot}: chunk at {start}, but {len(self.cache[slot])} cached"
        assert start + len(token_ids) <= self.max_len
        self.calls.append(("prefill", slot, start, len(token_ids)))
        self.cache[slot] = self.cache[slot][:start] + list(token_ids)
        return self.logits_after(token_ids[-1])

    def copy_slot(self, source: int, target: int) -> None:
        self._maybe_fail("copy")
        self.calls.append(("copy", source, target))
        self.cache[target] = list(self.cache[source])

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        self._maybe_fail("decode")
        if self.step_s:
            time.sleep(self.step_s)
        assert len(set(slots)) == len(slots), f"a slot twice in one batch: {slots}"
        for slot, token, position in zip(slots, tokens, positions):
            assert position <= len(self.cache[slot]), f"slot {slot}: decode at {position}, {len(self.cache[slot])} cached"
            self.cache[slot] = self.cache[slot][:position] + [int(token)]
        self.calls.append(("decode", tuple(slots)))
        return np.stack([self.logits_after(int(t)) for t in tokens])

    @property
    def decode_rows(self) -> list[int]:
        return [len(call[1]) for call in self.calls if call[0] == "decode"]

    def prefills(self) -> list[tuple[int, int, int]]:
        """(slot, start, length) of every prefill chunk, in order."""
        return [call[1:] for call in self.calls if call[0] == "prefill"]


# ---- letters, over the tiny byte-level tokenizer ----


def letters(eos_after_z: bool = False) -> Callable[[int], int]:
    """a -> b -> ... -> z -> a (or eos); anything else -> a."""

    def follow(token: int) -> int:
        letter = token - byte_token(ord("a"))
        if letter == 25 and eos_after_z:
            return IM_END
        return byte_token(ord("a") + (letter + 1) % 26 if 0 <= letter < 26 else ord("a"))

    return follow


class OnePassChainRunner(ChainRunner):
    """A ChainRunner that takes a whole engine step in one call, as the int8-lite runner does: nothing compiles,
    and a failure fails the whole step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.failures["step"] = []
        self.compiler = None

    def step(self, slots, tokens, positions, chunks=()) -> StepOutput:
        self._maybe_fail("step")
        chunk_slots = [c.slot for c in chunks]
        assert len(set(chunk_slots)) == len(chunk_slots), f"two chunks for one slot: {chunk_slots}"
        assert not set(chunk_slots) & set(slots), f"a slot both prefills and decodes: {chunk_slots}, {slots}"
        self.calls.append(("step", tuple(slots), tuple((c.slot, c.start, len(c.token_ids), c.every_logits)
                                                       for c in chunks)))
        prefilled = [self.extend(c.slot, c.start, c.token_ids) if c.wants_logits else self._write(c) for c in chunks]
        decoded = self.decode(slots, tokens, positions) if slots else np.zeros((0, self.vocab_size), np.float32)
        return StepOutput(decoded, prefilled)

    def _write(self, chunk) -> None:
        self.extend(chunk.slot, chunk.start, chunk.token_ids)


class ContextRunner(OnePassChainRunner):
    """A one-pass runner whose next token follows from every token before it (`row(context)`: the logits after a
    slot's positions 0..p), not only the last, and which checks drafts: a chunk with `every_logits` gives the logits
    after each of its tokens. Its cache is cut at each write, so a position the engine wrote but then dropped is
    never read again, as a real runner's attention reads only positions up to the row's own."""

    def __init__(self, row: Callable[[list[int]], np.ndarray], vocab_size: int, **options):
        super().__init__(lambda token: 0, vocab_size, **options)
        self.row = row
        self.checks_drafts = True

    def step(self, slots, tokens, positions, chunks=()) -> StepOutput:
        out = super().step(slots, tokens, positions, chunks)
        for i, chunk in enumerate(chunks):
            if chunk.every_logits:
                cache = self.cache[chunk.slot]
                out.prefilled[i] = np.stack([self.row(cache[:chunk.start + k + 1])
                                             for k in range(len(chunk.token_ids))])
        return out

    def extend(self, slot: int, start: int, token_ids: Sequence[int]) -> np.ndarray:
        super().extend(slot, start, token_ids)
        return self.row(self.cache[slot])

    def decode(self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        super().decode(slots, tokens, positions)
        return np.stack([self.row(self.cache[slot][:position + 1]) for slot, position in zip(slots, positions)])

    @property
    def checks(self) -> list[tuple[int, int, int]]:
        """(slot, start, rows) of every chunk that checked a draft, in order."""
        return [chunk[:3] for call in self.calls if call[0] == "step" for chunk in call[2] if chunk[3]]


def letter_runner(eos_after_z: bool = False, one_pass: bool = False, **options) -> ChainRunner:
    return (OnePassChainRunner if one_pass else ChainRunner)(letters(eos_after_z), VOCAB_SIZE, **options)


# ---- a fixed answer, for server tests ----


class ScriptTokenizer:
    """The tokenizer interface for a scripted answer. Ids 0..n-1 are the answer's pieces in order, n is eos, and
    from n + 1 on prompt ids: one per message start, one per word (by its checksum), so equal texts encode
    equally and a conversation's next turn starts with its earlier turns. With `system_prompt` the system prompt
    is encoded as a first message, as a chat template does (`system` None: default_system_prompt; "": none).
    Records every encode_chat call, and how many characters of message text encode_chat and count have read."""

    name = "scripted"
    default_system_prompt = "Be a tutor."
    tool_format = GENERIC  # a template without tools, as the embedded model's; its fixed answers call none
    max_prompt_words = 4096

    def __init__(self, pieces: Sequence[str], system_prompt: bool = False):
        self.pieces = list(pieces)
        self.eos = len(self.pieces)
        self.eos_token_ids = (self.eos,)
        self.vocab_size = self.eos + 1 + self.max_prompt_words
        self.system_prompt = system_prompt
        self.calls: list[tuple[list[dict[str, str]], str | None]] = []
        self.read = 0
        self.prefixes = 0  # chat_prefix calls
        self.prepared = 0  # prepare calls

    def encode_chat(self, messages, system=None, tools=None) -> list[int]:
        self.calls.append((list(messages), system))
        self.read += sum(len(m["content"]) for m in messages)
        return self._encode(self._with_system(messages, system))

    def count(self, text: str, limit: int) -> int:
        """As Tokenizer.count: a token a word."""
        self.read += len(text)
        return len(text.split())

    def prepare(self) -> None:
        """As Tokenizer.prepare, counted: nothing here is built late."""
        self.prepared += 1

    def chat_prefix(self, system=None) -> list[int]:
        """As Tokenizer.chat_prefix: the system prompt's message, if encoded, and the first message's start."""
        self.prefixes += 1
        return self._encode(self._with_system([], system)) + [self.eos + 1]

    def _with_system(self, messages, system) -> list[dict[str, str]]:
        system = self.default_system_prompt if system is None else system
        if not self.system_prompt or not system or any(m["role"] == "system" for m in messages):
            return list(messages)
        return [{"role": "system", "content": system}, *messages]

    def _encode(self, messages) -> list[int]:
        ids = []
        for m in messages:
            ids.append(self.eos + 1)
            ids += [self.word(word) for word in m["content"].split()]
        return ids

    def word(self, word: str) -> int:
        return self.eos + 2 + zlib.crc32(word.encode()) % (self.max_prompt_words - 1)

    def encode_text(self, text: str) -> list[int]:
        """An answer's text as pieces, the longest that fits first (ties to the lowest id), for a continuation
        sent as text; text no piece spells is encoded as prompt words."""
        ids, at = [], 0
        by_length = sorted(range(self.eos), key=lambda i: (-len(self.pieces[i]), i))
        while at < len(text):
            piece = next((i for i in by_length if self.pieces[i] and text.startswith(self.pieces[i], at)), None)
            if piece is None:
                return ids + [self.word(w) for w in text[at:].split()]
            ids.append(piece)
            at += len(self.pieces[piece])
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return self.pieces[token_id].encode() if token_id < self.eos else b""

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset({self.eos})

    @property
    def token_text(self):
        """What the detokenizer reads: each id's bytes, leading spaces kept (as byte-level BPE does)."""
        from typewriter.text.token_text import LeadingSpace, TokenText

        return TokenText([self.token_bytes(i) for i in range(self.vocab_size)], LeadingSpace.KEEP)

    def follow(self, token: int) -> int:
        """A prompt token starts the answer; each piece is followed by the next; the last by eos."""
        return 0 if token > self.eos else min(token + 1, self.eos)


class RecordingEngine(Engine):
    """The real engine, keeping every request it accepted so a test can read the parameters that reached it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.submitted = []

    def submit(self, request, on_event) -> None:
        super().submit(request, on_event)
        self.submitted.append(request)


def script_engine(pieces: Sequence[str] = ("Hello", ",", " world", "!"), step_s: float = 0.005, slots: int = 2,
                  max_queue: int = 2, max_context: int = 256, prefill_budget: int = 16,
                  start: bool = True, system_prompt: bool = False, parameters: int = 0,
                  keep_for_readers_s: float = 0.0) -> RecordingEngine:
    """A real Engine whose every answer is `pieces` then eos; `engine.tokenizer` encodes chats as words (the
    system prompt too, with `system_prompt`); `parameters`: the weights' count it says its model has."""
    tokenizer = ScriptTokenizer(pieces, system_prompt)
    runner = ChainRunner(tokenizer.follow, tokenizer.vocab_size, slots=slots, max_len=max_context, max_chunk=64,
                         step_s=step_s)
    engine = RecordingEngine(runner, tokenizer, max_queue=max_queue, prefill_budget=prefill_budget,
                             model_name="scripted-model", parameters=parameters,
                             keep_for_readers_s=keep_for_readers_s)
    return engine.start() if start else engine


def factory(engine: Engine, gate=None):
    """An engine factory for create_app, handing over `engine` and its tokenizer; with `gate` (an Event),
    loading blocks until it is set."""

    def load(settings, progress):
        progress("loading scripted weights")
        if gate is not None:
            gate.wait(timeout=10)
        progress("warmed up")
        return engine, engine.tokenizer

    return load


# ---- a model that calls the server's calculator ----


def call_pieces(expression: str, name: str = "calculator") -> list[str]:
    """A Hermes-style call of `name` with `expression`, in the pieces a model would write it in."""
    arguments = json.dumps({"expression": expression})
    return ["<tool_call>", "\n", f'{{"name": "{name}", ', f'"arguments": {arguments}', "}", "\n", "</tool_call>"]


class CallingTokenizer(ScriptTokenizer):
    """A scripted model whose template takes tools: its answer after k tool results is `rounds[k]` (the last round
    once past them), then eos. A prompt ends with a marker of how many tool results it holds, so the runner knows
    which round it answers. Records the tools each encode_chat was given."""

    tool_format = HERMES

    def __init__(self, rounds: Sequence[Sequence[str]], system_prompt: bool = False):
        super().__init__([piece for part in rounds for piece in part], system_prompt)
        self.starts = [sum(len(r) for r in rounds[:k]) for k in range(len(rounds))]
        self.ends = {start + len(r) - 1 for start, r in zip(self.starts, rounds)}
        self.markers = self.vocab_size  # marker k is this + k
        self.vocab_size += len(rounds)
        self.tools: list[object] = []

    def encode_chat(self, messages, system=None, tools=None) -> list[int]:
        self.tools.append(tools)
        results = sum(m["role"] == "tool" for m in messages)
        return super().encode_chat(messages, system, tools) + [self.markers + min(results, len(self.starts) - 1)]

    def follow(self, token: int) -> int:
        if token >= self.markers:
            return self.starts[token - self.markers]
        if token > self.eos:
            return 0
        return self.eos if token in self.ends or token == self.eos else token + 1


def calling_engine(rounds: Sequence[Sequence[str]], step_s: float = 0.005, slots: int = 2, max_queue: int = 2,
                   max_context: int = 256) -> RecordingEngine:
    """A real Engine on the scripted runner whose model answers by `rounds` (CallingTokenizer)."""
    tokenizer = CallingTokenizer(rounds)
    runner = ChainRunner(tokenizer.follow, tokenizer.vocab_size, slots=slots, max_len=max_context, max_chunk=64,
                         step_s=step_s)
    return RecordingEngine(runner, tokenizer, max_queue=max_queue, prefill_budget=16,
                           model_name="calling-model").start()
