"""What constrained rows add to the engine's decode step: 16 answers decoded together, of which 0, 4 or 16 keep to a
JSON Schema (each row's mask computed on a worker thread beside the forward pass, applied before sampling), the step times read from the
engine's own observer (`Engine.on_step`). The configurations alternate, so a busy machine slows them alike.

    .venv/bin/python bench/constrained_steps.py [--model PATH] [--rounds 3] [--tokens 96]

One JSON line per run: the constrained rows, the median and p95 of the decode-only steps with every row running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading

# The constrained answers cannot end before their length does, as the free ones run with ignore_eos: every step
# has all 16 rows.
LONG = {"type": "object", "required": ["explanation"], "additionalProperties": False,
        "properties": {"explanation": {"type": "string", "minLength": 4000}}}
QUESTION = "Explain how photosynthesis works, step by step."


def run(engine, tokenizer, rows: int, constrained: int, tokens: int) -> dict:
    from typewriter.engine.request import Constraint, ConstraintKind, Finished, GenerationRequest, SamplingParams

    steps: list[tuple[float, int]] = []
    engine.on_step = lambda s: steps.append((s.seconds, s.decode_rows))
    prompt = tokenizer.encode_chat([{"role": "user", "content": QUESTION}])
    done = threading.Semaphore(0)
    schema = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(LONG))
    for i in range(rows):
        free = i >= constrained
        params = SamplingParams(max_new_tokens=tokens, temperature=0.7, seed=i, ignore_eos=free,
                                constraint=None if free else schema)
        engine.submit(GenerationRequest(f"r{constrained}-{i}-{id(steps)}", prompt, params),
                      lambda e: done.release() if isinstance(e, Finished) else None)
    for _ in range(rows):
        done.acquire()
    engine.on_step = None
    full = [s for s, n in steps if n == rows]
    full = full[len(full) // 4:]  # after every prompt was prefilled
    ms = sorted(s * 1000 for s in full)
    if not ms:  # answers too short to see a step with every row decoding
        return {"rows": rows, "constrained": constrained, "steps": 0}
    return {"rows": rows, "constrained": constrained, "steps": len(ms), "median_ms": round(statistics.median(ms), 2),
            "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96, help="tokens per answer")
    parser.add_argument("--rows", type=int, default=16)
    args = parser.parse_args()
    from typewriter.assemble import load
    from typewriter.config import lite_cache_dir

    engine, tokenizer, _ = load(args.model, slots=args.rows, max_context=1024, max_queue=64, prefill_budget=256,
                                program_cache=lite_cache_dir())
    try:
        run(engine, tokenizer, args.rows, args.rows, 8)  # warm: the vocabulary view and the programs
        for r in range(args.rounds):
            for constrained in (0, args.rows // 4, args.rows):
                print(json.dumps({"round": r, **run(engine, tokenizer, args.rows, constrained, args.tokens)}),
                      flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
