"""Where one student's decode step goes in int8-lite today, and what 4-bit weights would make of it (issue 40's
estimate): the real step, timed whole and by part, beside the step's matrices alone as LiteRT int8 and as the
prototype C kernel (bench/q4_kernels.py's chain), in one process, interleaved.

    .venv/bin/python bench/q4_step.py [--model F.gguf] [--position 150] [--steps 64] [--rounds 5]

The step is `LiteRunner.decode` of one row at `--position` cached positions (its programs from the program
cache, made there first if missing), timed whole and by part with wrappers: the layer programs (int8 matmuls and
their small ops, two-pass rows where int8-lite has them), the attention kernel, the logits program, and the rest
(the embedding row, Python). The estimate for a C q4 step is the measured step with its programs' time replaced
by the q4 chain's (every matrix in one C call; `c-q4-py` calls it once a matrix from Python): the other ops of a
layer (norms, SiLU, the residual adds) are left out, as a runtime that ran a whole layer in C would make them a
small part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def open_runner(path: Path):
    from typewriter.assemble import open_runner as assemble
    from typewriter.config import WeightFormat, lite_cache_dir
    from typewriter.runners.options import RunnerOptions

    opened = assemble(path, RunnerOptions(WeightFormat.INT8_LITE, max_context=2048, slots=1,
                                          program_cache=lite_cache_dir()))
    return opened.cfg, opened.runner


class Timed:
    """A callable that adds its calls' seconds to `into[name]`."""

    def __init__(self, call, into: dict, name: str):
        self.call, self.into, self.name = call, into, name

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.call(*args, **kwargs)
        finally:
            self.into[self.name] = self.into.get(self.name, 0.0) + time.perf_counter() - start


def step_parts(runner, position: int, steps: int) -> dict:
    """Milliseconds a decode step, median over `steps`, whole and by part."""
    parts: dict[str, float] = {}
    layers = runner.layers
    runner.layers = [Timed(layer, parts, "layer programs") for layer in layers]
    first, logits, attend = runner.first, runner.logits, runner.cache.attend
    runner.first = Timed(first, parts, "layer programs")
    runner.logits = Timed(logits, parts, "logits program")
    runner.cache.attend = Timed(attend, parts, "attention")
    rows = {"step": [], "layer programs": [], "logits program": [], "attention": []}
    try:
        runner.decode([0], [1], [position])  # resizes the programs to one row
        for i in range(steps):
            parts.clear()
            start = time.perf_counter()
            runner.decode([0], [1 + i % 100], [position])
            rows["step"].append(time.perf_counter() - start)
            for name in ("layer programs", "logits program", "attention"):
                rows[name].append(parts.get(name, 0.0))
    finally:
        runner.layers, runner.first, runner.logits, runner.cache.attend = layers, first, logits, attend
    out = {name: round(statistics.median(ts) * 1e3, 3) for name, ts in rows.items()}
    out["step_best"] = round(min(rows["step"]) * 1e3, 3)
    out["rest"] = round(out["step"] - out["layer programs"] - out["logits program"] - out["attention"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--position", type=int, default=150)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", help="q4_kernels.MODELS' name for the model's shapes (default: from its dim)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import numpy as np
    from q4_kernels import LAYER, MODELS, _c_chain, _lite_chain, timed

    from typewriter.weights.source import resolve_model_path

    cfg, runner = open_runner(resolve_model_path(args.model))
    name = args.shapes or {576: "135m", 896: "0.5b", 1536: "1.5b"}[cfg.dim]
    kinds, layers = MODELS[name]
    order = [kinds[k] for _ in range(layers) for k in LAYER] + [kinds["logits"]]
    rng = np.random.default_rng(0)
    chains = {"lite-int8 chain": _lite_chain(order, rng), "c-q4 chain": _c_chain(order, rng, 4, one_call=True),
              "c-q4-1t chain": _c_chain(order, rng, 4, one_call=True, threads=1),
              "c-q4-py chain": _c_chain(order, rng, 4), "c-q4m chain": _c_chain(order, rng, 41, one_call=True)}
    rounds = []
    for r in range(args.rounds):  # interleaved: a busy moment of the machine touches each alike
        row = {"round": r, **step_parts(runner, args.position, args.steps)}
        for chain, call in chains.items():
            row[chain] = round(statistics.median(timed(call, 9)) * 1e3, 3)
        programs = row["layer programs"] + row["logits program"]
        for chain in ("c-q4", "c-q4-1t", "c-q4m"):  # the step with its programs' time replaced by the chain's
            row[f"estimate {chain} step"] = round(row["step"] - programs + row[f"{chain} chain"], 3)
            row[f"today / estimate {chain}"] = round(row["step"] / row[f"estimate {chain} step"], 2)
        rounds.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": cfg.name, "position": args.position, "rounds": rounds},
                                              indent=2))


if __name__ == "__main__":
    main()
