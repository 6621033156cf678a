"""Cached starts of two trees of the package and llama-server's start, alternating, polled every 5 ms (bench/start.py
polls every 100 ms, coarser than the difference asked about here):

    .venv/bin/python bench/results/2026-12-07-check/ab_ready.py A=/path/to/tree/a/backend B=/path/b/backend \
        [--model F] [--rounds 10]

Each tree's cache is filled by one start of its own first (not timed). Per start: launch -> ready (/readyz, /health)
and launch -> the first text of a tutoring answer (32 tokens at most), as bench/start.py asks it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # bench/
from classroom_clients import LlamaChat, Params, TypewriterChat  # noqa: E402
from classroom_servers import HOST, Server, build_llama_server, embedded_model, free_port  # noqa: E402
from start import CONTEXT, SLOTS, ask, caches  # noqa: E402

POLL_S = 0.005


def ours(backend: str, cache: Path, model: str, weights: str) -> tuple[float, float]:
    port = free_port()
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port), "--max-active",
            str(SLOTS), "--max-context", str(CONTEXT), "--model", model, "--weights", weights]
    server = Server("typewriter", argv, port, "/readyz", caches(cache) | {"PYTHONPATH": backend})
    t0 = time.perf_counter()
    with server.start(300, poll_s=POLL_S):
        ready = time.perf_counter() - t0
        first = ready + ask(TypewriterChat(f"ws://{HOST}:{port}/ws", Params(32, 300)))
    server.stop()
    return ready, first


def peer(binary: str, model: str) -> tuple[float, float]:
    port = free_port()
    argv = [binary, "-m", model, "--host", HOST, "--port", str(port), "-np", str(SLOTS), "-c", str(SLOTS * CONTEXT),
            "-t", "2"]
    server = Server("llama-server", argv, port, "/health")
    t0 = time.perf_counter()
    with server.start(300, poll_s=POLL_S):
        ready = time.perf_counter() - t0
        first = ready + ask(LlamaChat(server.http_url, Params(32, 300)))
    server.stop()
    return ready, first


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs=2, help="NAME=BACKEND_FOLDER, twice")
    parser.add_argument("--model", default=None)
    parser.add_argument("--weights", default="q4-blocks")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = args.model or str(embedded_model())
    trees = dict(tree.split("=", 1) for tree in args.trees)
    binary = build_llama_server()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in [*trees, "llama-server"]}
    with tempfile.TemporaryDirectory(prefix="ab-ready-") as folder:
        for name, backend in trees.items():
            ours(backend, Path(folder) / name, model, args.weights)  # fills the cache
        for _ in range(args.rounds):
            for name, backend in trees.items():
                times[name].append(ours(backend, Path(folder) / name, model, args.weights))
            times["llama-server"].append(peer(binary, model))
            print("  ".join(f"{n} {r:.3f}/{f:.3f}" for n, ts in times.items() for r, f in ts[-1:]), flush=True)
    print(f"{Path(model).name}, {args.weights}, {args.rounds} rounds; load before {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        ready, first = sorted(r for r, _ in ts), sorted(f for _, f in ts)
        print(f"{name:14} ready median {statistics.median(ready):.3f} s ({ready[0]:.3f}-{ready[-1]:.3f}), "
              f"first text median {statistics.median(first):.3f} s ({first[0]:.3f}-{first[-1]:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": Path(model).name, "weights": args.weights, "times": times}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
