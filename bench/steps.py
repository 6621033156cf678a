"""What one compiled call costs: a prefill chunk by size and start, a decode step by batch and position, and a
cache copy. The numbers behind the prefill budget and the limits the studies in docs/measurements/ name.

    .venv/bin/python bench/steps.py [--weights fp32|int8|int8-lite]   # 8 slots, 2,048 positions (the server's defaults)
"""

from __future__ import annotations

import argparse
import json
import time


def median_ms(call, repeats: int = 9) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(sorted(times)[repeats // 2] * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", help="weight format (default: the server's)")
    args = parser.parse_args()
    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    from typewriter.assemble import open_runner
    from typewriter.config import Settings, WeightFormat
    from typewriter.runners.options import RunnerOptions

    fmt = WeightFormat(args.weights or Settings().model.weights)
    runner = open_runner(None, RunnerOptions(fmt, 2048, slots=8, compile="lazy")).runner
    ids = list(range(100, 400))
    from typewriter.runners.xla.start import CHUNK_BUCKETS

    fmt = runner.weight_format
    for chunk in CHUNK_BUCKETS:
        for start in (0, 1400):
            ms = median_ms(lambda: runner.extend(1, start, ids[:chunk]))
            print(json.dumps({"weights": fmt, "call": "prefill chunk", "tokens": chunk, "start": start, "ms": ms}),
                  flush=True)
    for rows in (1, 2, 4, 8):
        for position in (100, 1500):
            ms = median_ms(lambda: runner.decode(list(range(rows)), [5] * rows, [position] * rows))
            print(json.dumps({"weights": fmt, "call": "decode", "rows": rows, "position": position, "ms": ms}),
                  flush=True)
    print(json.dumps({"call": "cache copy", "ms": median_ms(lambda: runner.copy_slot(0, 1))}), flush=True)


if __name__ == "__main__":
    main()
