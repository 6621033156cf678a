"""engine_step.py [MODEL]: one student through the Engine (as `typewriter bench` runs it: one slot, 256 greedy
tokens, three runs): the runner's step alone (median and mean ms) against the whole token's wall time, so the
engine's own share shows."""
import statistics
import sys
import time

from typewriter.assemble import load
from typewriter.commands.bench import TUTOR_QUESTION, _run
from typewriter.config import Settings

engine, tok, _ = load(sys.argv[1] if len(sys.argv) > 1 else None, slots=1, max_context=2048, max_queue=0,
                      prefill_budget=Settings().engine.prefill_budget, progress=lambda m: None, weight_format="auto")
runner, took = engine.runner, []
step = runner.step


def timed(*args, **kwargs):
    began = time.perf_counter()
    out = step(*args, **kwargs)
    took.append(time.perf_counter() - began)
    return out


runner.step = timed
prompt = tok.encode_chat([{"role": "user", "content": TUTOR_QUESTION}])
for _ in range(3):
    took.clear()
    began = time.perf_counter()
    result = _run(engine, [prompt], 256)[0]
    wall = time.perf_counter() - began
    print(f"tokens/s {result['tokens_per_s']:.1f}; runner ms a step: median {1000 * statistics.median(took):.2f}, "
          f"mean {1000 * statistics.fmean(took):.2f}; wall ms a token {1000 * wall / 256:.2f}")
engine.shutdown()
