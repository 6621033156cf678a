"""start_parts.py [MODEL] [off]: a cached q4-blocks start's parts one after another in one process, ms: what
`typewriter serve` imports, the lite runner's modules, the GGUF's header, the tokenizer, the runner (mapped blocks),
the engine. `off`: the cyclic collector turned off first, as `typewriter serve` does. Each pass of the collector is
timed by a callback and summed by generation (their callbacks' own cost included)."""
import gc
import sys
import time

passes = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
began_pass = [0.0]


def timed(phase: str, info: dict) -> None:
    if phase == "start":
        began_pass[0] = time.perf_counter()
    else:
        passes[info["generation"]][0] += 1
        passes[info["generation"]][1] += time.perf_counter() - began_pass[0]


if len(sys.argv) > 2 and sys.argv[2] == "off":
    gc.disable()
gc.callbacks.append(timed)
t0 = time.perf_counter()
import typewriter.cli, typewriter.commands.serve, typewriter.server.app, typewriter.server.main, uvicorn  # noqa: E401, E402, F401, I001
t1 = time.perf_counter()
import dataclasses  # noqa: E402
from pathlib import Path  # noqa: E402

from typewriter import assemble  # noqa: E402
from typewriter.config import WeightFormat, lite_cache_dir  # noqa: E402
from typewriter.engine.engine import Engine  # noqa: E402
from typewriter.runners.lite import start as lite_start  # noqa: E402
from typewriter.runners.options import RunnerOptions  # noqa: E402
from typewriter.weights.source import embedded_model_path, open_source, read_config  # noqa: E402

t2 = time.perf_counter()
path = Path(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else embedded_model_path()
source, _ = open_source(path)
t3 = time.perf_counter()
cfg = read_config(source)
tokenizer = assemble._tokenizer(path, source)
t4 = time.perf_counter()
options = RunnerOptions(WeightFormat.AUTO, 2048, None, lite_cache_dir(), "start")
options = dataclasses.replace(options, weights=assemble.weights_for(cfg, options.weights))
runner = lite_start.open_runner(source, cfg, tokenizer.encode, options, lambda _: None)
t5 = time.perf_counter()
engine = Engine(runner, tokenizer, max_queue=64, prefill_budget=256, model_name="x", queue_timeout_s=None,
                parameters=cfg.parameters)
t6 = time.perf_counter()
ms = [round(1000 * (b - a)) for a, b in zip((t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6))]
print(f"{path.name}: imports {ms[0]}, lite modules {ms[1]}, header {ms[2]}, tokenizer {ms[3]}, runner {ms[4]}, "
      f"engine {ms[5]}; collector passes by generation: "
      + ", ".join(f"{g}: {n} in {1000 * s:.1f} ms" for g, (n, s) in passes.items()))
