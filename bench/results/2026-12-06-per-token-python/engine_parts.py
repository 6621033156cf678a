"""engine_parts.py [MODEL|-] (ROWS=N in the environment, default 1): N students through the Engine (q4-blocks, N
slots, 257 greedy tokens each, three runs), each part of a step timed where it runs (perf_counter_ns wrappers):
median microseconds a call. Also times the logits row's argmax twice before the sampler (cold, then warm) and counts
how often the first maximum was a penalised id. Run with PYTHONPATH=backend."""
import sys, time, statistics, queue, collections, json
from typewriter.assemble import load
from typewriter.commands.bench import TUTOR_QUESTION
from typewriter.engine.request import GenerationRequest, SamplingParams, Finished
from typewriter.engine import engine as E
model = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None
ROWS = int(__import__("os").environ.get("ROWS", "1"))
engine, tok, _ = load(model, slots=ROWS, max_context=2048, max_queue=0, prefill_budget=512, weight_format="q4-blocks")
prompt = tok.encode_chat([{"role": "user", "content": TUTOR_QUESTION}])
acc = collections.defaultdict(list)
def wrap(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter_ns(); r = f(*a, **k); acc[label].append(time.perf_counter_ns() - t); return r
    setattr(obj, name, w)
r = engine.runner
wrap(engine.scheduler, "schedule", "schedule")
wrap(engine, "_take", "_take")
wrap(engine, "_emit", "_emit")
wrap(engine, "step", "step")
wrap(engine.grammars, "wait", "grammars.wait")
wrap(engine.grammars, "begin", "grammars.begin")
wrap(engine.scheduler.costs, "observe", "costs.observe")
wrap(engine, "_weigh_slots", "_weigh_slots")
wrap(engine, "_wait_for_work", "_wait_for_work")
wrap(r, "step", "runner.step")
bm = r.blocks
for n in ("forward", "logits", "embed"):
    if hasattr(bm, n): wrap(bm, n, "blocks." + n)
from typewriter.engine import request_state as RS
from typewriter.engine import repetition as REP
from typewriter.text import detokenizer as DT, stops as ST
for cls, n in ((REP.LoopGuard, "push"), (DT.IncrementalDetokenizer, "push"), (ST.StopMatcher, "push")):
    f = getattr(cls, n)
    def mk2(f, label):
        def w(self, *a, **k):
            t = time.perf_counter_ns(); r = f(self, *a, **k); acc[label].append(time.perf_counter_ns() - t); return r
        return w
    setattr(cls, n, mk2(f, cls.__name__ + "." + n))
for n in ("sample", "take", "_pipe"):
    f = getattr(RS.RequestState, n)
    def mk(f, n):
        def w(self, *a, **k):
            t = time.perf_counter_ns(); r = f(self, *a, **k); acc["rs." + n].append(time.perf_counter_ns() - t); return r
        return w
    setattr(RS.RequestState, n, mk(f, n))
from typewriter.engine import sampling as SM
f0 = SM.Sampler.sample
import numpy as np
cnt = collections.Counter()
def ws(self, *a, **k):
    row, seen = a
    t = time.perf_counter_ns(); b = int(np.argmax(row)); acc["argmax"].append(time.perf_counter_ns() - t)
    t = time.perf_counter_ns(); b2 = int(np.argmax(row)); acc["argmax2"].append(time.perf_counter_ns() - t)
    cnt[b in seen] += 1
    t = time.perf_counter_ns(); r = f0(self, *a, **k); acc["sampler.sample"].append(time.perf_counter_ns() - t); return r
SM.Sampler.sample = ws
def go(n):
    params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    ev = queue.SimpleQueue()
    for i in range(ROWS):
        engine.submit(GenerationRequest(f"r{time.perf_counter_ns()}-{i}", prompt + [10 + i], params), ev.put)
    done = 0
    while done < ROWS:
        e = ev.get()
        if isinstance(e, Finished): done += 1
    return e
go(16)
for _ in range(3):
    acc.clear(); e = go(257)
    print(json.dumps({"token_ms": round(1000 / e.timings.tokens_per_s, 3), **{k: round(statistics.median(v[3:]) / 1000, 1) for k, v in acc.items()}}))
print(cnt)
engine.shutdown()
