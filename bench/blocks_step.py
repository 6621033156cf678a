"""One decode step of q4-blocks against int8-lite's, in one process: the same step by the blocks kernel
(runners/lite/blocks.c) and by int8-lite's programs, each runner with its own K/V cache prefilled alike, interleaved
round by round, so a busy moment of the machine touches both alike. Also the kernel on 1 and 2 threads, and on
AVX2 alone.

    .venv/bin/python bench/blocks_step.py [--model F.gguf] [--position 150] [--rows 1,2,4,8] [--steps 30]
        [--rounds 5] [--json artifacts/blocks-step.json]

The runners are opened as the server opens them (`--weights q4-blocks` and `int8-lite`, from the program cache,
made there first if missing); each slot is prefilled to `--position`, then each variant decodes `--steps` steps of
`rows` rows at that position (the same K/V written again each time). Reported per variant and row count: the
milliseconds of a step, median and best over every step of every round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def open_runner(path: Path | None, slots: int, weights: str):
    from typewriter.assemble import open_runner as open_any
    from typewriter.config import WeightFormat, lite_cache_dir
    from typewriter.runners.options import RunnerOptions

    options = RunnerOptions(WeightFormat(weights), 2048, slots=slots, program_cache=lite_cache_dir())
    return open_any(path, options).runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--position", type=int, default=150)
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    model = Path(args.model) if args.model else None
    blocks, programs = (open_runner(model, max(rows), weights) for weights in ("q4-blocks", "int8-lite"))
    kernel = blocks.blocks.kernel
    for runner in (blocks, programs):
        for slot in range(max(rows)):
            runner.extend(slot, 0, [(7 * slot + i) % 1000 + 10 for i in range(args.position)])

    def variant(by_blocks: bool, threads: int, wide: bool):
        def setup():
            runner = blocks if by_blocks else programs
            runner.cache.threads = threads
            kernel.set_wide(wide)
            return runner
        return setup

    variants = {"int8-lite programs": variant(False, 2, True), "q4-blocks": variant(True, 2, True),
                "q4-blocks 1 thread": variant(True, 1, True), "q4-blocks avx2": variant(True, 2, False)}
    if not kernel.wide:
        del variants["q4-blocks avx2"]  # it is the only path here
    times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in rows} for name in variants}
    for _ in range(args.rounds):
        for name, setup in variants.items():
            runner = setup()
            for n in rows:
                slots, tokens, positions = list(range(n)), [5] * n, [args.position] * n
                runner.step(slots, tokens, positions)  # untimed: a new row count resizes the programs' buffers
                for _ in range(args.steps):
                    start = time.perf_counter()
                    runner.step(slots, tokens, positions)
                    times[name][n].append((time.perf_counter() - start) * 1000)
    variants["q4-blocks"]()
    report = {"model": blocks.cfg.name, "position": args.position, "avx512_vnni": kernel.wide,
              "blocks_mb": round(blocks.blocks.nbytes / 1e6, 1), "steps": {}}
    for name, by_rows in times.items():
        report["steps"][name] = {n: {"median_ms": round(statistics.median(t), 2), "best_ms": round(min(t), 2)}
                                 for n, t in by_rows.items()}
        print(json.dumps({"variant": name, **{f"{n} rows": v for n, v in report["steps"][name].items()}}), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
