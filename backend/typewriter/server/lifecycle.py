"""The server's lifecycle: load the engine on a thread while /healthz already answers, report readiness, drain on
shutdown. The phase changes only on the event loop, through checked transitions."""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..config import Settings, parse_address_caps, parse_proxies
from ..engine.request import Constraint, Event, GenerationRequest
from ..errors import TypewriterError
from ..text.tool_format import ToolFormat
from .classes import Classes, Classroom, load_classes
from .identity import Identities
from .limits import Limits
from .load_estimate import LoadEstimate
from .metrics import Metrics
from .owners import Owners, shared_prefixes

if TYPE_CHECKING:  # the engine's own records, named only: the server imports no runtime before it loads one
    from ..engine.engine import EngineStats, StepStats

log = logging.getLogger("typewriter.server")

# The server quiet this long (_quiet_for) before what is built late is built (_warm_when_idle): the tokenizer's BPE
# and the classes' prompts soon, so that a class coming a moment after ready finds them, but not at once, so that the
# first /readyz does not wait on them; the constraints' tokenizers later (docs/measurements/2026-12-06-late-tokenizer.md).
TOKENIZER_WHEN_QUIET_S = 0.1
WARM_WHEN_IDLE_S = 0.5
WARM_POLL_S = 0.1


class GrammarCompiler(Protocol):
    def compile(self, constraint: Constraint, owner: str = "") -> object:
        """Raises InvalidRequest if it does not compile or costs too much; kept in `owner`'s share."""

    def warm(self) -> None:
        """Prepares what every constraint needs, ahead of the first."""


class EngineHandle(Protocol):
    """What the server needs of `engine.engine.Engine`: structural, so that the server never imports a runtime."""

    max_context: int
    max_queue: int
    repetition_penalty: float  # a request's when it names none: the model's (engine.request.default_repetition_penalty)
    on_step: Callable[[StepStats], None] | None  # called on the engine thread

    @property
    def grammars(self) -> GrammarCompiler: ...
    def submit(self, request: GenerationRequest, on_event: Callable[[Event], None]) -> None: ...
    def cancel(self, request_id: str) -> bool: ...
    def stats(self) -> EngineStats: ...
    def describe_runtime(self) -> dict[str, Any]: ...
    def describe_slots(self) -> str: ...
    @property
    def max_active(self) -> int: ...
    @property
    def alive(self) -> bool: ...
    @property
    def failed(self) -> bool: ...
    def shutdown(self) -> None: ...


class ChatEncoder(Protocol):
    name: str
    default_system_prompt: str  # what encode_chat uses when it is given system=None
    tool_format: ToolFormat  # how its answers write a tool call: its chat template's way, or the generic one
    eos_token_ids: frozenset[int]  # the ids that end an answer: not listed among log probabilities
    special_ids: frozenset[int]  # control tokens: no client's text names them

    def encode_chat(self, messages: Sequence[dict[str, Any]], system: str | None = None,
                    tools: Sequence[dict[str, Any]] | None = None) -> list[int]: ...
    def encode_text(self, text: str) -> list[int]: ...  # a client's text: control tokens in it as plain text
    def chat_prefix(self, system: str | None = None) -> list[int]: ...
    def count(self, text: str, limit: int) -> int: ...  # reads no further than past `limit`
    def token_bytes(self, token_id: int) -> bytes: ...
    def prepare(self) -> None: ...  # builds now what the first encoding would otherwise build


Progress = Callable[[str], None]
EngineFactory = Callable[[Settings, Progress], tuple[EngineHandle, ChatEncoder]]


def load_real_engine(settings: Settings, progress: Progress) -> tuple[EngineHandle, ChatEncoder]:
    from ..assemble import load_engine  # imports TensorFlow: only ever on the loader thread

    engine: EngineHandle
    tokenizer: ChatEncoder
    engine, tokenizer = load_engine(settings, progress)  # annotated above so that mypy holds them to the Protocols
    return engine, tokenizer


@dataclass(frozen=True)
class ClassPrompt:
    """A class's system prompt (None: the tokenizer's default) and the tokens its chats begin with, longest first
    (owners.shared_prefixes), which its students share in the prefix cache."""

    system: str | None
    prefixes: tuple[list[int], ...]


def class_prompts(classes: Classes, settings: Settings, tokenizer: ChatEncoder) -> dict[str, ClassPrompt]:
    """Each class's prompt; a class whose tutor adds nothing has the server's own."""
    server = settings.answers.system_prompt
    base = tokenizer.default_system_prompt if server is None else server
    prompts = {}
    for classroom in classes.all:
        system = server if classroom.tutor.plain else classroom.tutor.system_prompt(base)
        prompts[classroom.name] = ClassPrompt(system, shared_prefixes(tokenizer.chat_prefix, system,
                                                                       tokenizer.default_system_prompt))
    return prompts


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


_NEXT = {
    Phase.LOADING: {Phase.READY, Phase.FAILED, Phase.STOPPING},
    Phase.READY: {Phase.STOPPING},
    Phase.FAILED: {Phase.STOPPING},
    Phase.STOPPING: set(),
}


class ServerState:
    def __init__(self, settings: Settings, engine_factory: EngineFactory, classes: Classes | None = None):
        """`classes` None: those of `settings` (the default class alone without a classes file)."""
        self.settings = settings
        self.phase = Phase.LOADING
        self.engine: EngineHandle | None = None
        self.tokenizer: ChatEncoder | None = None
        self.owners = Owners()
        self.classes = load_classes(settings) if classes is None else classes
        self.identities = Identities(self.classes, settings.identity.identity_secret)
        self.prompts: dict[str, ClassPrompt] = {}  # worked out on the first chat or once idle (class_prompt)
        self._prompts_lock = threading.Lock()
        self.progress = "starting"
        self.load_estimate = LoadEstimate()
        self.error: str | None = None
        self.metrics = Metrics(self._engine_counts, self._class_counts, self._readers)
        limits = settings.limits
        self.limits = Limits(limits.max_connections, limits.max_connections_per_client, limits.chats_per_minute,
                             parse_proxies(limits.trusted_proxies), address_caps=parse_address_caps(limits.address_caps),
                             identities_per_minute=settings.identity.identities_per_minute)
        self._factory = engine_factory
        self._ids = itertools.count(1)
        self._in_flight = 0
        self._drained = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._chat_came_at = 0.0  # time.monotonic() of the latest chat opened (chat_came)

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY and self.engine is not None and self.engine.alive

    @property
    def engine_failed(self) -> bool:
        return self.phase is Phase.READY and self.engine is not None and self.engine.failed

    def health(self) -> tuple[bool, dict[str, Any]]:
        """The /healthz body: alive unless the engine has failed for good (a supervisor should restart us)."""
        if self.engine_failed:
            return False, {"status": "engine_failed", "detail": "the engine failed; see the server log"}
        return True, {"status": "ok"}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """The /readyz body. A server whose slots and queue are all taken answers 503 "full", so that a balancer
        sends new chats to another replica until one frees."""
        engine, tokenizer = self.engine, self.tokenizer
        if self.ready and engine is not None and tokenizer is not None:
            s, stats = self.settings, engine.stats()
            body: dict[str, Any] = {
                "status": "ready",
                "model": s.model.id,
                "tokenizer": tokenizer.name,
                "limits": {
                    "max_active": engine.max_active, "max_queue": engine.max_queue,
                    "max_context": engine.max_context, "max_new_tokens": s.answers.default_length,
                    "max_new_tokens_cap": s.answers.length_cap, "max_messages": s.socket.max_messages,
                    "max_message_bytes": s.socket.max_message_bytes,
                },
                "load": {"active": stats.active, "queued": stats.queued},
                "classes": {name: {"active": active, "queued": queued}
                            for name, (active, queued) in self._class_counts().items()},
                "runtime": engine.describe_runtime(),
            }
            if stats.active >= engine.max_active and stats.queued >= engine.max_queue:
                return False, body | {"status": "full", "detail": "every slot is busy and the wait queue is full; "
                                                                  "new chats get overloaded until one frees"}
            return True, body
        if self.phase is Phase.READY:
            return False, {"status": "engine_stopped", "detail": "the engine thread has died; see the server log"}
        body = {"status": self.phase.value}
        if self.phase is Phase.LOADING:
            body["progress"] = self.progress
            body |= self.load_estimate.at(time.monotonic())
        if self.error:
            body["detail"] = self.error
        return False, body

    def next_request_id(self) -> str:
        return f"r{next(self._ids)}"

    def start_loading(self) -> None:
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._load, args=(loop,), name="typewriter-loader", daemon=True).start()

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            engine, tokenizer = self._factory(self.settings, self._report)
        except Exception as e:  # shown on /readyz; the process decides to exit
            if isinstance(e, TypewriterError):  # a named, actionable error: no traceback
                log.error("loading the model failed: %s", e)
            else:
                log.exception("loading the model failed")
            loop.call_soon_threadsafe(self._failed, f"{type(e).__name__}: {e}")
        else:
            loop.call_soon_threadsafe(self._loaded, engine, tokenizer)

    def _report(self, message: str) -> None:
        self.progress = message
        self.load_estimate.report(message, time.monotonic())
        log.info("loading: %s", message)

    def _loaded(self, engine: EngineHandle, tokenizer: ChatEncoder) -> None:
        if self.phase is Phase.STOPPING:
            threading.Thread(target=engine.shutdown, daemon=True).start()
            return
        self.engine, self.tokenizer = engine, tokenizer
        engine.on_step = self.metrics.step
        self._move(Phase.READY)
        threading.Thread(target=self._warm_when_idle, args=(engine, tokenizer), name="typewriter-warm",
                         daemon=True).start()
        log.info("ready: %s, %s, queue %d, context %d",
                 self.settings.model.id, engine.describe_slots(), engine.max_queue, engine.max_context)

    def _warm_when_idle(self, engine: EngineHandle, tokenizer: ChatEncoder) -> None:
        """What is built late, each part once the server has been quiet a while (`_quiet_for`): the tokenizer's BPE
        (a GGUF's) and the classes' prompts after TOKENIZER_WHEN_QUIET_S, the constraints' tokenizers after
        WARM_WHEN_IDLE_S. Built before ready or as the server turned ready, each held the GIL (a quarter of a second
        apiece on a 150k vocabulary) on the start's path or just as the first /readyz and chats came; built one after
        another, the last held a class's first chats back (docs/measurements/2026-12-06-start-off-the-gil.md,
        docs/measurements/2026-12-06-late-tokenizer.md). A chat or constraint that comes first builds what it needs
        itself, and meets the same error if a part fails here."""
        parts = ((tokenizer.prepare, TOKENIZER_WHEN_QUIET_S),
                 (lambda: self._class_prompts(tokenizer), TOKENIZER_WHEN_QUIET_S),
                 (engine.grammars.warm, WARM_WHEN_IDLE_S))
        for part, quiet_s in parts:
            if not self._quiet_for(engine, quiet_s):
                return
            try:
                part()
            except Exception:
                log.exception("building ahead of the first chat failed; the first chat that needs it tries again")

    def _quiet_for(self, engine: EngineHandle, seconds: float) -> bool:
        """True once, for `seconds`, the engine has had nothing to do, no chat has streamed and none has come (one
        being encoded is not the engine's yet); False if the server stops serving first."""
        quiet_since = time.monotonic()
        while self.phase is Phase.READY and engine.alive:
            time.sleep(WARM_POLL_S)
            stats = engine.stats()
            if stats.active or stats.queued or self._in_flight:
                quiet_since = time.monotonic()
            elif time.monotonic() - max(quiet_since, self._chat_came_at) >= seconds:
                return True
        return False

    def chat_came(self) -> None:
        """A chat is being opened: the warm-up waits for a quiet server."""
        self._chat_came_at = time.monotonic()

    def _failed(self, message: str) -> None:
        if self.phase is Phase.LOADING:
            self.error = message
            self._move(Phase.FAILED)

    def _move(self, phase: Phase) -> None:
        if phase not in _NEXT[self.phase]:
            raise RuntimeError(f"server phase cannot go from {self.phase.value} to {phase.value}")
        self.phase = phase

    def stream_opened(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def stream_closed(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    def begin_drain(self) -> None:
        """No new chat or socket from now on; running answers go on. Safe from a signal handler, and twice."""
        if self.phase is not Phase.STOPPING:
            self._move(Phase.STOPPING)
            log.info("draining: %d chats running; no new ones", self._in_flight)

    async def drain(self, hurry: Callable[[], bool] = lambda: False) -> None:
        """Let running answers finish for up to `drain_s` (or until `hurry()`), then end the rest; drains once."""
        self.begin_drain()
        if self._drained:
            return
        self._drained = True
        deadline = time.monotonic() + self.settings.serving.drain_s
        while self._in_flight and time.monotonic() < deadline and not hurry():
            try:
                await asyncio.wait_for(self._idle.wait(), min(0.1, max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                pass
        if self._in_flight:
            log.info("drain: %d chats still running after %.1fs; ending them", self._in_flight,
                     self.settings.serving.drain_s)
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)
        try:
            await asyncio.wait_for(self._idle.wait(), self.settings.serving.shutdown_grace_s)
        except TimeoutError:
            log.warning("shutdown: %d streams did not end within %.1fs", self._in_flight,
                        self.settings.serving.shutdown_grace_s)

    async def class_prompt(self, classroom: Classroom) -> ClassPrompt:
        """`classroom`'s prompt, its tokens encoded off the event loop the first time."""
        prompt = self.prompts.get(classroom.name)
        if prompt is None:
            assert self.tokenizer is not None, "asked for a class's prompt before the model loaded"
            prompt = (await asyncio.to_thread(self._class_prompts, self.tokenizer))[classroom.name]
        return prompt

    def _class_prompts(self, tokenizer: ChatEncoder) -> dict[str, ClassPrompt]:
        with self._prompts_lock:
            if not self.prompts:
                self.prompts = class_prompts(self.classes, self.settings, tokenizer)
            return self.prompts

    def _engine_counts(self) -> tuple[int, int]:
        if self.engine is None:
            return 0, 0
        stats = self.engine.stats()
        return stats.active, stats.queued

    def _readers(self) -> int:
        return self.engine.stats().readers if self.engine is not None else 0

    def _class_counts(self) -> dict[str, tuple[int, int]]:
        """(active, queued) of every class, also those with none."""
        groups = self.engine.stats().groups if self.engine is not None else {}
        return {c.name: groups.get(c.name, (0, 0)) for c in self.classes.all}
