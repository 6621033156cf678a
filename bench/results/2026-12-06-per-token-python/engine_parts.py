"""engine_parts.py [MODEL|-] (ROWS=N in the environment, default 1): N students through the Engine (q4-blocks, N
slots, 257 greedy tokens each, three runs), each part of a step timed where it runs (perf_counter_ns wrappers):
median microseconds a call. Also times the logits row's argmax twice before the sampler (cold, then warm) and counts
how often the first maximum was a penalised id. Run from the repository root with PYTHONPATH=backend."""
import collections
import json
import os
import queue
import statistics
import sys
import time

import numpy as np
from timing import timed  # this folder's: a script's own folder is on its path

from typewriter.assemble import load
from typewriter.commands.bench import TUTOR_QUESTION
from typewriter.engine import sampling
from typewriter.engine.repetition import LoopGuard
from typewriter.engine.request import Finished, GenerationRequest, SamplingParams
from typewriter.engine.request_state import RequestState
from typewriter.text.detokenizer import IncrementalDetokenizer
from typewriter.text.stops import StopMatcher

model = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None
ROWS = int(os.environ.get("ROWS", "1"))
engine, tokenizer, _ = load(model, slots=ROWS, max_context=2048, max_queue=0, prefill_budget=512,
                            weight_format="q4-blocks")
prompt = tokenizer.encode_chat([{"role": "user", "content": TUTOR_QUESTION}])
took: dict[str, list[int]] = collections.defaultdict(list)


for owner, name, label in [(engine.scheduler, "schedule", "schedule"), (engine, "_take", "_take"),
                           (engine, "_emit", "_emit"), (engine, "step", "step"),
                           (engine.grammars, "wait", "grammars.wait"), (engine.grammars, "begin", "grammars.begin"),
                           (engine.scheduler.costs, "observe", "costs.observe"),
                           (engine, "_weigh_slots", "_weigh_slots"), (engine, "_wait_for_work", "_wait_for_work"),
                           (engine.runner, "step", "runner.step"), (engine.runner.blocks, "forward", "blocks.forward"),
                           (engine.runner.blocks, "logits", "blocks.logits"),
                           (engine.runner.blocks, "embed", "blocks.embed")]:
    setattr(owner, name, timed(getattr(owner, name), label, took))
for cls, name in [(LoopGuard, "push"), (IncrementalDetokenizer, "push"), (StopMatcher, "push"),
                  (RequestState, "sample"), (RequestState, "take"), (RequestState, "_pipe")]:
    setattr(cls, name, timed(getattr(cls, name), f"{cls.__name__}.{name}", took))
first_is_seen: collections.Counter[bool] = collections.Counter()
sample = sampling.Sampler.sample


def sample_timed(self, row, seen):
    for label in ("argmax", "argmax2"):  # the row as the kernel left it, then again
        began = time.perf_counter_ns()
        best = int(np.argmax(row))
        took[label].append(time.perf_counter_ns() - began)
    first_is_seen[best in seen] += 1
    return timed(sample, "sampler.sample", took)(self, row, seen)


sampling.Sampler.sample = sample_timed


def run(tokens: int) -> Finished:
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    events: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(ROWS):
        engine.submit(GenerationRequest(f"r{time.perf_counter_ns()}-{i}", prompt + [10 + i], params), events.put)
    done = 0
    while done < ROWS:
        event = events.get()
        if isinstance(event, Finished):
            done, last = done + 1, event
    return last


run(16)
for _ in range(3):
    took.clear()
    finished = run(257)
    print(json.dumps({"token_ms": round(1000 / finished.timings.tokens_per_s, 3),
                      **{k: round(statistics.median(v[3:]) / 1000, 1) for k, v in took.items()}}))
print(first_is_seen)
engine.shutdown()
