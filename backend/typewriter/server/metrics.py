"""Prometheus metrics, in a registry owned by one app so tests and several apps in a process never collide."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from ..engine.request import Finished, Started

if TYPE_CHECKING:
    from ..engine.engine import StepStats

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_INTER_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# From one int8-lite decode row to an XLA prefill chunk beside a full batch (bench/steps.py measures them).
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class ClassLoad(Collector):
    """Each class's requests in slots and waiting, read at scrape time. Labelled by the class's name, from the
    classes file (never a student's text), so there are as many series as classes."""

    def __init__(self, counts: Callable[[], Mapping[str, tuple[int, int]]]):
        self.counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        active = GaugeMetricFamily("typewriter_class_active_streams", "Requests holding a slot, by class.",
                                   labels=["class"])
        queued = GaugeMetricFamily("typewriter_class_queued_requests", "Requests waiting for a slot, by class.",
                                   labels=["class"])
        for name, (a, q) in self.counts().items():
            active.add_metric([name], a)
            queued.add_metric([name], q)
        yield active
        yield queued


class Metrics:
    def __init__(self, engine_counts: Callable[[], tuple[int, int]],
                 class_counts: Callable[[], Mapping[str, tuple[int, int]]] = dict,
                 readers: Callable[[], int] = lambda: 0):
        """`engine_counts` returns (active streams, queued requests), `class_counts` the same by class name,
        `readers` the students kept a share while they read; all read at scrape time."""
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(ClassLoad(class_counts))
        self.class_chats = Counter("typewriter_class_chats", "Chats submitted, each of n choices counting, by class.",
                                   ["class"], registry=r)
        self.class_tokens = Counter("typewriter_class_generated_tokens", "Tokens generated, by class.", ["class"],
                                    registry=r)
        self.requests = Counter("typewriter_requests", "Chats that ended, by finish reason.", ["reason"], registry=r)
        self.tool_steps = Counter("typewriter_tool_steps", "Calculator steps the server ran, by outcome: ok or the "
                                  "refusal's code.", ["outcome"], registry=r)
        self.rejected = Counter(
            "typewriter_rejected_requests", "Frames answered with an error, by error code.", ["code"], registry=r)
        self.time_to_first_token = Histogram(
            "typewriter_time_to_first_token_seconds", "From a chat's submission to its first generated token.",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = Histogram(
            "typewriter_inter_token_latency_seconds", "Between consecutive generated tokens of one chat.",
            buckets=_INTER_TOKEN_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "typewriter_queue_wait_seconds", "From a chat's submission until it got a slot.",
            buckets=_QUEUE_BUCKETS, registry=r)
        self.generated_tokens = Counter("typewriter_generated_tokens", "Tokens generated.", registry=r)
        self.prompt_tokens = Counter("typewriter_prompt_tokens", "Prompt tokens of chats that got a slot.", registry=r)
        self.prefix_reused_tokens = Counter(
            "typewriter_prefix_reused_tokens",
            "Of those, tokens found already cached (an earlier turn, a shared system prompt): not computed again.",
            registry=r)
        self.connections = Gauge("typewriter_open_connections", "Open WebSocket connections.", registry=r)
        self.dropped_connections = Counter(
            "typewriter_dropped_connections",
            "Connections closed before they sent a whole request header: too slow (header_timeout), or the oldest "
            "waiting past a cap (pending_per_client, pending_total).", ["reason"], registry=r)
        active = Gauge("typewriter_active_streams", "Requests holding a slot.", registry=r)
        active.set_function(lambda: engine_counts()[0])
        queued = Gauge("typewriter_queued_requests", "Requests waiting for a slot.", registry=r)
        queued.set_function(lambda: engine_counts()[1])
        kept = Gauge("typewriter_readers_kept", "Students whose answer ended within keep_for_readers_s: each still "
                     "counts for a slot in the fair shares, so another's extra chats may wait while slots are free.",
                     registry=r)
        kept.set_function(readers)
        self.step_seconds = Histogram(
            "typewriter_engine_step_seconds", "One engine step that ran the model: prefill chunks and a decode step.",
            buckets=_STEP_BUCKETS, registry=r)
        self.parked = Counter(
            "typewriter_parked_requests", "Answers that gave their slot back to a student holding fewer slots than "
            "its fair share while it waited; each resumes where it was.", registry=r)
        self.batch_size = Histogram(
            "typewriter_engine_batch_size", "Streams decoded together in one decode step.",
            buckets=_BATCH_BUCKETS, registry=r)
        self.draft_tokens = Counter(
            "typewriter_draft_tokens", "Tokens guessed from a chat's conversation and checked in a step, by outcome: "
            "taken (the answer's, each for a fraction of a step) or refused.", ["outcome"], registry=r)

    def step(self, stats: StepStats) -> None:
        """On the engine thread: nothing here may block."""
        self.step_seconds.observe(stats.seconds)
        if stats.decode_rows:
            self.batch_size.observe(stats.decode_rows)
        if stats.parked:
            self.parked.inc(stats.parked)
        if stats.drafted:
            self.draft_tokens.labels(outcome="taken").inc(stats.taken)
            self.draft_tokens.labels(outcome="refused").inc(stats.drafted - stats.taken)

    def started(self, event: Started) -> None:
        self.queue_wait.observe(event.queue_ms / 1000)
        self.prompt_tokens.inc(event.prompt_tokens)
        self.prefix_reused_tokens.inc(event.cached_tokens)

    def finished(self, event: Finished) -> None:
        self.requests.labels(reason=event.reason.value).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
