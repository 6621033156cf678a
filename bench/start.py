"""Start-up time and memory against llama.cpp's llama-server, in one run.

    .venv/bin/python bench/start.py --json artifacts/start.json
    .venv/bin/python bench/start.py --model "$(scripts/fetch-qwen-0.5b.sh)"      # another GGUF file
    .venv/bin/python bench/start.py --weights q4-blocks                          # another weight format

Our server at its defaults (8 slots, 2,048 tokens of context each) and llama-server with the same slots and
context (scripts/build-llama-server.sh builds it), each asked one tutoring question the moment it is ready:
  ready        launch -> GET /readyz (ours) or /health (theirs) answers 200
  first text   launch -> the first text of that answer
  programs     ours: launch -> every XLA program compiled (the background's work; the first few before ready)
  peak RSS     the server's VmHWM once everything is compiled and the answer is done
Ours runs twice: with empty cache folders, XLA's and int8-lite's (cold), then with what the first run left in them
(warm). The CLI rows time `typewriter generate` from launch to its first answer byte on stdout, cold and warm, on
cache folders of their own. Run it on an otherwise idle machine; the other processes' load average is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from classroom_clients import LlamaChat, Params, TypewriterChat
from classroom_servers import HOST, Server, build_llama_server, embedded_model, free_port

QUESTION = [{"role": "user", "content": "Why is dividing by a fraction the same as multiplying by its reciprocal?"}]
SLOTS, CONTEXT = 8, 2048
# /readyz and /health asked every 10 ms: every 100 ms hid differences of tens of ms between the two servers
# (docs/measurements/2026-12-07-check-off-the-path.md)
POLL_S = 0.01


def ask(chat) -> float:
    async def one() -> float:
        async with chat as c:
            turn = await c.ask(QUESTION)
        if turn.error:
            raise RuntimeError(f"the answer failed: {turn.error} {turn.detail}")
        return turn.ttft_s

    return asyncio.run(one())


def caches(folder: Path) -> dict[str, str]:
    """Both of our caches in `folder`: XLA's programs (fp32) and int8-lite's (the user's own would make "cold"
    warm)."""
    return {"TYPEWRITER_XLA_CACHE": str(folder), "TYPEWRITER_LITE_CACHE": str(folder / "lite")}


def ours(cache: Path, args: argparse.Namespace) -> dict:
    port = free_port()
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port),
            "--max-active", str(SLOTS), "--max-context", str(CONTEXT), "--model", args.model,
            "--weights", args.weights]
    server = Server("typewriter", argv, port, "/readyz", caches(cache))
    t0 = time.perf_counter()
    with server.start(args.ready_timeout, poll_s=POLL_S):
        ready = time.perf_counter() - t0
        sent = time.perf_counter() - t0
        first = sent + ask(TypewriterChat(f"ws://{HOST}:{port}/ws", Params(32, args.ready_timeout)))
        while True:  # XLA's other programs compile in the background; int8-lite's were all made at load
            programs = httpx.get(server.http_url + "/readyz", timeout=5).json()["runtime"]["programs"]
            if "made_at_load" in programs or programs["compiled"] == programs["total"]:
                break
            time.sleep(0.5)
        compiled = time.perf_counter() - t0
        peak, rss = server.status("VmHWM"), server.status("VmRSS")
    return {"ready_s": round(ready, 2), "first_text_s": round(first, 2), "all_programs_s": round(compiled, 1),
            "programs": programs.get("total", programs.get("made_at_load")), "peak_rss_mb": peak // 1024, "rss_mb": rss // 1024}


def peer(binary: str, args: argparse.Namespace) -> dict:
    port = free_port()
    argv = [binary, "-m", args.model, "--host", HOST, "--port", str(port), "-np", str(SLOTS),
            "-c", str(SLOTS * CONTEXT), "-t", "2"]
    server = Server("llama-server", argv, port, "/health")
    t0 = time.perf_counter()
    with server.start(args.ready_timeout, poll_s=POLL_S):
        ready = time.perf_counter() - t0
        first = time.perf_counter() - t0 + ask(LlamaChat(server.http_url, Params(32, args.ready_timeout)))
        peak, rss = server.status("VmHWM"), server.status("VmRSS")
    return {"ready_s": round(ready, 2), "first_text_s": round(first, 2), "peak_rss_mb": peak // 1024,
            "rss_mb": rss // 1024}


def cli(cache: Path, model: str, weights: str) -> float:
    """`typewriter generate`: launch to the first byte of the answer on stdout."""
    env = {**os.environ, **caches(cache)}
    t0 = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "typewriter", "generate", QUESTION[0]["content"],
                                "--max-new-tokens", "8", "--model", model, "--weights", weights],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    process.stdout.read(1)
    first = time.perf_counter() - t0
    process.stdout.read()
    if process.wait() != 0:
        raise RuntimeError(f"typewriter generate exited with {process.returncode}")
    return round(first, 1)


def run(args: argparse.Namespace) -> dict:
    result = {"machine": os.uname().machine, "model": Path(args.model).name, "weights": args.weights,
              "load_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="typewriter-xla-") as server_cache, \
            tempfile.TemporaryDirectory(prefix="typewriter-xla-cli-") as cli_cache:
        for label in ("cold", "warm"):
            print(f"our server, {label} cache ...", file=sys.stderr, flush=True)
            result[f"ours_{label}"] = ours(Path(server_cache), args)
            print(f"  {result[f'ours_{label}']}", file=sys.stderr, flush=True)
        if args.warm_repeats > 1:  # the cached start again: its spread
            result["ours_warm_ready_s"] = [result["ours_warm"]["ready_s"]] + [
                ours(Path(server_cache), args)["ready_s"] for _ in range(args.warm_repeats - 1)]
            print(f"  ready, cached, each run: {result['ours_warm_ready_s']}", file=sys.stderr, flush=True)
        for label in ("cold", "warm"):
            result[f"cli_{label}_first_text_s"] = cli(Path(cli_cache), args.model, args.weights)
            print(f"typewriter generate, {label} cache: first text after {result[f'cli_{label}_first_text_s']} s",
                  file=sys.stderr, flush=True)
    if not args.no_peer:
        print("llama-server ...", file=sys.stderr, flush=True)
        binary = args.llama_server or build_llama_server()
        result["llama_server"] = peer(binary, args)
        print(f"  {result['llama_server']}", file=sys.stderr, flush=True)
        if args.warm_repeats > 1:
            result["llama_server_ready_s"] = [result["llama_server"]["ready_s"]] + [
                peer(binary, args)["ready_s"] for _ in range(args.warm_repeats - 1)]
            print(f"  ready, each run: {result['llama_server_ready_s']}", file=sys.stderr, flush=True)
    return result


def report(r: dict) -> str:
    rows = [("", "ready s", "first text s", "all programs s", "peak RSS MB")]
    for label in ("cold", "warm"):
        o = r[f"ours_{label}"]
        rows.append((f"typewriter serve, {label}", o["ready_s"], o["first_text_s"], o["all_programs_s"],
                     o["peak_rss_mb"]))
    if "llama_server" in r:
        p = r["llama_server"]
        rows.append(("llama-server", p["ready_s"], p["first_text_s"], "-", p["peak_rss_mb"]))
    rows.append(("typewriter generate, cold", "-", r["cli_cold_first_text_s"], "-", "-"))
    rows.append(("typewriter generate, warm", "-", r["cli_warm_first_text_s"], "-", "-"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--model", help="the GGUF file both servers load (default: the embedded model)")
    parser.add_argument("--weights", default="auto", help="our server's and CLI's --weights (default auto)")
    parser.add_argument("--llama-server", help="a llama-server binary (default: build it with the script)")
    parser.add_argument("--no-peer", action="store_true", help="only our server and CLI")
    parser.add_argument("--ready-timeout", type=float, default=900.0, metavar="S")
    parser.add_argument("--warm-repeats", type=int, default=1, metavar="N",
                        help="start our server from the filled cache, and llama-server, N times each (the spread)")
    args = parser.parse_args()
    args.model = args.model or embedded_model()
    # compiled as pip, `make run` and the image have them: where PYTHONDONTWRITEBYTECODE is set, each start would
    # otherwise compile our modules again (docs/measurements/2026-12-06-start-off-the-gil.md)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).parents[1] / "backend/typewriter")],
                   check=True)
    result = run(args)
    print(report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
