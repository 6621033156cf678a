"""What resuming an answer costs: memory per kept chat, and the server time of a continuation.

    .venv/bin/python bench/resume.py --json artifacts/resume.json

1. Memory. The embedded model writes one greedy answer of 1,024 tokens (its own words, eos ignored) in this
   process; its events are then kept the way the server keeps them, through the real SocketChat (protocol v1
   frames with ids) and SseChat (the OpenAI door's SSE bytes), and for answers of 64, 256 and 1,024 tokens this
   reports the bytes the registry counts against resume_buffer_bytes and the Python heap one kept chat holds
   with everything it brings (its ChatStream, log, tasks; tracemalloc, over 50 copies).
2. Time. Two `typewriter serve` processes, A and B (the embedded model, 4 slots). For each round and cut K, A
   answers a question greedily (resumable, up to 512 tokens); B, which never saw it, is then asked (a) a fresh
   question of the same shape, and (b) to continue A's answer after its first K tokens (`continue` with text and
   ids), each stopped after its first token. The continuation's extra server time is its time to first token
   (the engine's clock: submit to first token, which holds the prefill of the conversation and the K tokens)
   minus the fresh question's. Also on A: the same continuation where the conversation is cached (a resume that
   found no kept chat on the replica that wrote it), and a resume of a kept chat (send `resume`, wait for
   `resumed` and the first replayed frame).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

from classroom_servers import embedded_model, typewriter_server
from websockets.asyncio.client import connect

TOPICS = ["how plants make food", "why the sky is blue", "how vaccines work", "what causes the seasons",
          "how a bill becomes a law", "why ice floats", "how volcanoes form", "what a prime number is",
          "how the heart pumps blood", "why we have tides", "how rainbows form", "what inflation is",
          "how bees make honey", "why metals conduct electricity", "how clouds form", "what photosynthesis needs"]
CUTS = (32, 128, 256)
LENGTHS = (64, 256, 1024)
COPIES = 50


# ---- 1. memory ----


def memory() -> list[dict]:
    from typewriter import assemble
    from typewriter.engine.request import Finished, GenerationRequest, SamplingParams, Started

    engine, tokenizer, _ = assemble.load(None, slots=1, max_context=2048, max_queue=1, prefill_budget=16,
                                        compile="lazy")
    try:
        events = list(engine.stream(GenerationRequest(
            "m", tokenizer.encode_chat([{"role": "user", "content": f"Explain {TOPICS[0]}."}]),
            SamplingParams(max_new_tokens=max(LENGTHS), temperature=0.0, ignore_eos=True))))
    finally:
        engine.shutdown()
    started = next(e for e in events if isinstance(e, Started))
    tokens = [e for e in events if not isinstance(e, (Started, Finished))]
    finished = events[-1]
    rows = []
    for length in LENGTHS:
        answer = [started, *tokens[:length], finished]
        rows.append({"tokens": length, "text_bytes": sum(len(t.text.encode()) for t in tokens[:length]),
                     **asyncio.run(keep(answer, "socket")), **asyncio.run(keep(answer, "sse"))})
    return rows


async def keep(events: list, door: str) -> dict:
    """Keep `COPIES` chats of `events` through the door's kept chat; (counted bytes, heap bytes) per chat."""
    from typewriter.config import Settings
    from typewriter.server.chats import ChatStream
    from typewriter.server.lifecycle import ServerState
    from typewriter.server.openai.completions_request import parse_body
    from typewriter.server.openai.routes import Answer
    from typewriter.server.openai.streams import SseChat
    from typewriter.server.resume.registry import Resumes
    from typewriter.server.socket.resumable import SocketChat
    from typewriter.server.socket.session import Session

    settings = Settings.of(resume_buffer_bytes=1 << 30, resume_buffer_total_bytes=1 << 40)
    state = ServerState(settings, lambda *_: None)
    resumes = Resumes(settings, state.metrics.registry)
    completion = parse_body(json.dumps({"messages": [{"role": "user", "content": "q"}], "stream": True}).encode(),
                            settings.socket.max_messages)
    chats = []
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for n in range(COPIES):
        stream = ChatStream(state, f"{n:024x}", f"r{n}")
        for event in events:
            stream.events.put_nowait(event)
        if door == "socket":
            chat = SocketChat(resumes, stream, lambda s, e: Session._frame(None, s, e))
        else:
            chat = SseChat(resumes, stream, Answer(stream, completion, "model", lambda: None)._events(),
                           f"conversation-{n:08d}")
        chats.append(resumes.keep(chat))
    while not all(c.ended for c in chats):
        await asyncio.sleep(0)
    for chat in chats:
        chat._timer.cancel()  # the grace period's timer: not this measurement's
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))  # the chat, its stream, its log
    return {f"{door}_counted_bytes": resumes.bytes // COPIES, f"{door}_heap_bytes": held // COPIES}


# ---- 2. time ----


async def ask(url: str, frame: dict, stop_after_first: bool) -> tuple[list[dict], float]:
    """Send one chat frame; (its frames, wall seconds to its first token)."""
    async with connect(url, max_size=None) as ws:
        t0 = time.perf_counter()
        await ws.send(json.dumps(frame))
        frames, first = [], None
        while True:
            msg = json.loads(await ws.recv())
            frames.append(msg)
            if msg["type"] == "token" and first is None:
                first = time.perf_counter() - t0
                if stop_after_first:
                    await ws.send(json.dumps({"type": "stop", "id": frame["id"]}))
            if msg["type"] in ("end", "error"):
                assert msg["type"] == "end", msg
                return frames, first


def chat(chat_id: str, question: str, **extra) -> dict:
    return {"type": "chat", "id": chat_id, "messages": [{"role": "user", "content": question}],
            "params": {"temperature": 0, "max_new_tokens": 512}, "resumable": True, **extra}


async def resume_latency(url: str, question: str) -> float:
    """Seconds from sending `resume` on a new socket to the first replayed frame, for a chat whose socket closed."""
    async with connect(url) as ws:
        await ws.send(json.dumps(chat("kept", question)))
        token, got = None, 0
        while got < 10:
            msg = json.loads(await ws.recv())
            token = msg.get("resume_token", token)
            got += msg["type"] == "token"
    async with connect(url) as ws:
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "resume", "id": "kept", "token": token, "from": 5}))
        assert json.loads(await ws.recv())["type"] == "resumed"
        assert json.loads(await ws.recv())["type"] == "token"
        took = time.perf_counter() - t0
        await ws.send(json.dumps({"type": "stop", "id": "kept"}))
        while json.loads(await ws.recv())["type"] not in ("end", "error"):
            pass
        return took


async def timing(a: str, b: str, rounds: int) -> dict:
    topics = iter(TOPICS * 4)
    results: dict[str, list] = {"fresh_ttft_ms": [], "fresh_computed_tokens": [], "resume_s": []}
    for cut in CUTS:
        results[f"continue_{cut}_ttft_ms"] = []
        results[f"continue_{cut}_cached_ttft_ms"] = []
        results[f"continue_{cut}_computed_tokens"] = []
    for r in range(rounds):
        for cut in CUTS:
            question = f"In several paragraphs, explain {next(topics)}."
            frames, _ = await ask(a, chat(f"a{r}{cut}", question), stop_after_first=False)
            tokens = [f for f in frames if f["type"] == "token"]
            ids = [i for f in tokens for i in f["ids"]]
            if len(ids) <= cut:
                print(f"  round {r}: the answer had {len(ids)} tokens, not past {cut}; skipped", flush=True)
                continue
            upto = next(n for n, f in enumerate(tokens) if f["index"] + 1 >= cut) + 1
            ids = [i for f in tokens[:upto] for i in f["ids"]]
            start = {"text": "".join(f["text"] for f in tokens[:upto]), "ids": ids}
            fresh, _ = await ask(b, chat(f"f{r}{cut}", f"In several paragraphs, explain {next(topics)}."), True)
            cont, _ = await ask(b, chat(f"c{r}{cut}", question, **{"continue": start}), True)
            cached, _ = await ask(a, chat(f"h{r}{cut}", question, **{"continue": start}), True)
            assert cont[0]["continued"] == "ids", cont[0]
            results["fresh_ttft_ms"].append(fresh[-1]["timings"]["ttft_ms"])
            results["fresh_computed_tokens"].append(fresh[0]["prompt_tokens"] - fresh[0]["cached_tokens"])
            results[f"continue_{cut}_ttft_ms"].append(cont[-1]["timings"]["ttft_ms"])
            results[f"continue_{cut}_cached_ttft_ms"].append(cached[-1]["timings"]["ttft_ms"])
            results[f"continue_{cut}_computed_tokens"].append(cont[0]["prompt_tokens"] - cont[0]["cached_tokens"])
            print(f"  round {r} cut {len(ids)}: fresh {fresh[-1]['timings']['ttft_ms']:.0f} ms "
                  f"({fresh[0]['prompt_tokens']} prompt tokens, {fresh[0]['cached_tokens']} cached), continued "
                  f"{cont[-1]['timings']['ttft_ms']:.0f} ms ({cont[0]['prompt_tokens']} prompt tokens, "
                  f"{cont[0]['cached_tokens']} cached), on A {cached[-1]['timings']['ttft_ms']:.0f} ms "
                  f"({cached[0]['cached_tokens']} cached)", flush=True)
        results["resume_s"].append(await resume_latency(a, f"Explain {next(topics)}."))
    return {k: statistics.median(v) for k, v in results.items() if v}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    print("memory: one 1,024-token answer, kept 50 times per door", flush=True)
    kept = memory()
    for row in kept:
        print(f"  {row['tokens']:5d} tokens ({row['text_bytes']} bytes of text): socket {row['socket_counted_bytes']} "
              f"counted, {row['socket_heap_bytes']} on the heap; SSE {row['sse_counted_bytes']} counted, "
              f"{row['sse_heap_bytes']} on the heap", flush=True)
    print("time: A answers, B continues", flush=True)
    a, b = (typewriter_server(4, 32, 2048, embedded_model()) for _ in range(2))
    with a.start(timeout_s=600), b.start(timeout_s=600):
        ws = lambda s: s.http_url.replace("http://", "ws://") + "/ws"  # noqa: E731
        times = asyncio.run(timing(ws(a), ws(b), args.rounds))
    for key, value in times.items():
        print(f"  {key}: {value:.4g}", flush=True)
    result = {"machine": platform.processor() or platform.machine(), "memory": kept, "time": times}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
