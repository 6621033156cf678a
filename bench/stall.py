"""The two numbers behind the prefill budget and the prefix cache, measured on the engine in this process.

1. Stall: one answer streams while a ~1,500-token conversation arrives. Reported: the streaming answer's
   steady inter-token time, the longest gap it saw while the long prompt was prefilled, and their ratio
   (target: at most 3x).
2. Reuse: the second turn of that ~1,500-token conversation against a fresh 100-token prompt, time to first
   token of each and their ratio (target: at most 1.5x).

    .venv/bin/python bench/stall.py                 # the default budget
    .venv/bin/python bench/stall.py 16 32 64 128    # each budget in turn, on one loaded model
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import threading
import time

from typewriter.commands.args import setting_default
from typewriter.engine.request import Finished, GenerationRequest, SamplingParams, Started, Token
from typewriter.progress import StderrProgress

PARAGRAPH = ("A fraction names a part of a whole: the bottom number says how many equal parts the whole is cut "
             "into, and the top number says how many of those parts we take. ")


def conversation(tokenizer, target: int) -> list[dict[str, str]]:
    """Alternating turns of tutoring text until the chat is about `target` tokens."""
    messages, n = [], 0
    while n < target:
        messages += [{"role": "user", "content": f"Question {len(messages) // 2 + 1}: {PARAGRAPH}"},
                     {"role": "assistant", "content": PARAGRAPH * 3}]
        n = len(tokenizer.encode_chat(messages))
    return messages + [{"role": "user", "content": "So what is three quarters of twelve?"}]


class Stream:
    """One request; its tokens' times are taken on the engine thread, as each is emitted."""

    def __init__(self, engine, rid: str, ids: list[int], tokens: int):
        self.times: list[float] = []
        self.ids: list[int] = []
        self.started: Started | None = None
        self.done = threading.Event()
        self.sent = time.perf_counter()
        params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        engine.submit(GenerationRequest(rid, ids, params), self._on_event)

    def _on_event(self, event) -> None:
        if isinstance(event, Token):
            self.times.append(time.perf_counter())
            self.ids.append(event.token_id)
        elif isinstance(event, Started):
            self.started = event
        elif isinstance(event, Finished):
            self.done.set()

    def wait(self, condition=None, timeout: float = 600) -> None:
        deadline = time.perf_counter() + timeout
        while not (condition() if condition else self.done.is_set()):
            if time.perf_counter() > deadline:
                raise TimeoutError("the engine did not answer in time")
            time.sleep(0.005)

    @property
    def ttft_ms(self) -> float:
        return (self.times[0] - self.sent) * 1000


def stall(engine, tokenizer, long_ids: list[int]) -> dict:
    running = Stream(engine, "running", tokenizer.encode_chat([{"role": "user", "content": "Tell me a story."}]),
                     1500)
    running.wait(lambda: len(running.times) >= 40)
    steady = statistics.median(b - a for a, b in zip(running.times[-30:], running.times[-29:]))
    mark = len(running.times)
    newcomer = Stream(engine, "long", long_ids, 8)
    newcomer.wait(lambda: newcomer.times)
    end = newcomer.times[0]
    times = [t for t in running.times[mark - 1:] if t <= end + steady * 5]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for stream, rid in ((running, "running"), (newcomer, "long")):
        engine.cancel(rid)
        stream.wait()
    return {"steady_ms": round(steady * 1000, 1), "longest_gap_ms": round(max(gaps) * 1000, 1),
            "stall_ratio": round(max(gaps) / steady, 2), "long_prompt_ttft_ms": round(newcomer.ttft_ms, 1)}


def reuse(engine, tokenizer, messages: list[dict[str, str]], salt: str) -> dict:
    first_ids = tokenizer.encode_chat(messages)
    first = Stream(engine, f"turn1-{salt}", first_ids, 32)
    first.wait()
    answer = tokenizer.decode(first.ids)
    turn = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And of twenty?"}]
    second = Stream(engine, f"turn2-{salt}", tokenizer.encode_chat(turn), 4)
    second.wait()
    short = Stream(engine, f"short-{salt}", tokenizer.encode_chat(
        [{"role": "user", "content": f"{salt} What is a fraction? Explain it simply, with one small example."}]), 4)
    short.wait()
    return {"first_turn_tokens": len(first_ids), "first_turn_ttft_ms": round(first.ttft_ms, 1),
            "second_turn_tokens": second.started.prompt_tokens, "second_turn_cached": second.started.cached_tokens,
            "second_turn_ttft_ms": round(second.ttft_ms, 1), "short_prompt_tokens": short.started.prompt_tokens,
            "short_prompt_cached": short.started.cached_tokens, "short_prompt_ttft_ms": round(short.ttft_ms, 1),
            "reuse_ratio": round(second.ttft_ms / short.ttft_ms, 2)}


def main(budgets: list[int]) -> None:
    from typewriter.assemble import load

    engine, tokenizer, _ = load(None, slots=8, max_context=2048, max_queue=0, prefill_budget=budgets[0],
                                progress=StderrProgress("stall"))
    try:
        messages = conversation(tokenizer, 1500)
        for i, budget in enumerate(budgets):
            engine.scheduler.budget = budget  # the same compiled programs serve every budget
            # Each run's conversation starts differently, so nothing but the system prompt is cached from before.
            long_ids = tokenizer.encode_chat([{"role": "user", "content": f"Stall run {i}."}, *messages])
            row = {"prefill_budget": budget, "long_prompt_tokens": len(long_ids)}
            row |= stall(engine, tokenizer, long_ids)
            row |= reuse(engine, tokenizer, [{"role": "user", "content": f"Reuse run {i}."}, *messages], str(i))
            print(json.dumps(row), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]] or [setting_default("prefill_budget")])
