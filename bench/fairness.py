"""Fair shares of a busy server (issue 39): a classroom replayed against our server and against llama-server.

    PYTHONPATH=backend .venv/bin/python bench/fairness.py --json bench/results/2026-12-05-fairness.json

Every simulated student is a client of its own to our server: the script writes a classes file with an API key for
each student (a class per scenario and repeat, so no counter carries over from one to the next) and each of the
student's sockets sends `Authorization: Bearer <its key>`. llama-server has no clients, only requests, which it
serves first come, first served in its slots: the same classroom against it is the baseline without fairness.

A student runs one or more chats, each a closed loop for --window seconds after --warmup: a single-turn question
(the tutor's system prompt and one of bench/classroom.py's questions), the answer streamed, a reading pause (none
for a backlogged student), the next question. Tokens count when their text arrives (the client's clock), within the
window only; the chats in flight at its end are let finish so the load is the same to its last second.

Scenarios, each with 16 slots (our --max-active 16, llama-server -np 16):
  (a) class-15   15 ordinary students, one chat each, a reading pause between answers
      heavy      the same 15 and one more student running 8 chats at once, no pause
                 -> the ordinary students' first-token p95 and tokens/s, heavy against class-15 (target: within 10%)
                 -> (b) the heavy student's share of the tokens served while an ordinary student waits for its
                    first token (target: at most its fair share, 1/16, plus VTC's bound, read here as one more
                    request in flight: 2/16)
  (c) jain       16 backlogged students, even ones 2 chats at once, odd ones 4, no pause: Jain's fairness index of
                 the tokens each was served (target >= 0.95; first come, first served gives the 4-chat students
                 twice as much, an index near 0.9)
  (d) weights    two classes of weights 2 and 1, 8 students each, 2 chats at once each, no pause: tokens served by
                 the first over the second (target 2 within 10%: 1.8 to 2.2). Ours only: llama-server has no classes
  (e) alone      one student, one chat, no pause: tokens/s, ours against llama-server (work-conserving: a lone
                 student gets the whole server)

--keep-for-readers runs our server once for each value given (TYPEWRITER_KEEP_FOR_READERS_S; `default` leaves it
unset): kept readers hold back a student over its share while classmates read, which (a) and (b) count and (e)
must not pay for. Our server has no switch to turn fairness off, so (e)'s comparison is llama-server on the same GGUF file. Both
answer greedily with no repetition penalty. On a busy machine give llama-server `--threads 1`: with 2 threads on 2
shared cores its threads spin-wait for each other and one answer can take minutes. The load average is sampled every 5 s while the scenarios run and
reported with them: on a shared 2-core machine the other processes move every number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from classroom import QUESTIONS
from classroom_clients import LlamaChat, Params, Turn, TypewriterChat
from classroom_report import percentile
from classroom_servers import HOST, build_llama_server, embedded_model, llama_server, typewriter_server

SLOTS = 16
SCENARIOS = ("class-15", "heavy", "jain", "weights", "alone")
PEER_SCENARIOS = ("class-15", "heavy", "jain", "alone")


@dataclass(frozen=True)
class Student:
    name: str
    group: str  # its class in the classes file
    chats: int  # at once, each a closed loop
    pause: tuple[float, float]  # reading pause between answers, uniform in seconds
    key: str = field(default_factory=lambda: "tw-bench-" + secrets.token_urlsafe(24))


@dataclass(frozen=True)
class Scenario:
    name: str
    students: list[Student]
    weights: dict[str, float]  # class -> weight


def scenarios(repeat: int, pause: tuple[float, float]) -> dict[str, Scenario]:
    def cls(scenario: str, suffix: str = "") -> str:
        return f"{scenario}{suffix}-r{repeat}"

    none = (0.0, 0.0)
    ordinary = [Student(f"s{i:02}", cls("heavy"), 1, pause) for i in range(15)]
    return {
        "class-15": Scenario("class-15", [Student(f"s{i:02}", cls("class-15"), 1, pause) for i in range(15)],
                             {cls("class-15"): 1}),
        "heavy": Scenario("heavy", ordinary + [Student("heavy", cls("heavy"), 8, none)], {cls("heavy"): 1}),
        "jain": Scenario("jain", [Student(f"s{i:02}", cls("jain"), 2 if i % 2 == 0 else 4, none) for i in range(16)],
                         {cls("jain"): 1}),
        "weights": Scenario("weights", [Student(f"a{i:02}", cls("weights", "-w2"), 2, none) for i in range(8)]
                            + [Student(f"b{i:02}", cls("weights", "-w1"), 2, none) for i in range(8)],
                            {cls("weights", "-w2"): 2, cls("weights", "-w1"): 1}),
        "alone": Scenario("alone", [Student("s00", cls("alone"), 1, none)], {cls("alone"): 1}),
    }


def classes_file(all_scenarios: list[Scenario]) -> str:
    """TOML: one class per scenario and repeat (two for the weights), each student a key of its own."""
    lines = ["open = true", ""]
    for scenario in all_scenarios:
        for group, weight in scenario.weights.items():
            lines += ["[[class]]", f'name = "{group}"', f"weight = {weight}", "[class.students]"]
            lines += [f'{s.name} = "{s.key}"' for s in scenario.students if s.group == group]
            lines.append("")
    return "\n".join(lines)


class KeyedChat(TypewriterChat):
    """Our socket, sent with a student's API key: the server counts it against that student."""

    def __init__(self, url: str, params: Params, key: str):
        super().__init__(url, params)
        self.key = key

    async def __aenter__(self) -> KeyedChat:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, max_size=None, open_timeout=self.params.timeout_s,
                                additional_headers={"Authorization": f"Bearer {self.key}"})
        return self


@dataclass
class Record:
    student: str
    group: str
    sent: float
    turn: Turn

    def token_times(self) -> list[tuple[float, float]]:
        """(arrival, tokens) per non-empty text delta; a delta's tokens are the answer's share, one if unknown."""
        if self.turn.ttft_s is None:
            return []
        times = [self.sent + self.turn.ttft_s]
        for gap in self.turn.gaps_s:
            times.append(times[-1] + gap)
        each = self.turn.completion_tokens / len(times) if self.turn.completion_tokens else 1.0
        return [(t, each) for t in times]


async def lane(make_chat, student: Student, lane_no: int, system_prompt: str, until: float,
               records: list[Record], seed: int) -> None:
    from websockets.exceptions import WebSocketException

    rng = random.Random(f"{seed}/{student.name}/{lane_no}")
    await asyncio.sleep(rng.uniform(0, 0.5))
    try:
        async with make_chat(student) as chat:
            while time.perf_counter() < until:
                messages = [{"role": "system", "content": system_prompt},
                            {"role": "user", "content": rng.choice(QUESTIONS)}]
                sent = time.perf_counter()
                turn = await chat.ask(messages)
                records.append(Record(student.name, student.group, sent, turn))
                if turn.error:
                    await asyncio.sleep(1.0)
                if student.pause[1] > 0:
                    await asyncio.sleep(rng.uniform(*student.pause))
    except (OSError, TimeoutError, WebSocketException) as e:
        records.append(Record(student.name, student.group, time.perf_counter(),
                              Turn(error="connect", detail=f"{type(e).__name__}: {e}")))


async def replay(make_chat, scenario: Scenario, args: argparse.Namespace, system_prompt: str) -> dict:
    records: list[Record] = []
    start = time.perf_counter()
    window = (start + args.warmup, start + args.warmup + (args.alone_window if scenario.name == "alone"
                                                           else args.window))
    await asyncio.gather(*(lane(make_chat, s, k, system_prompt, window[1], records, args.seed)
                           for s in scenario.students for k in range(s.chats)))
    return measure(scenario, records, window) | {"wall_s": round(time.perf_counter() - start, 1)}


def jain(values: list[float]) -> float | None:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else None


def measure(scenario: Scenario, records: list[Record], window: tuple[float, float]) -> dict:
    low, high = window
    seconds = high - low
    tokens = {s.name: 0.0 for s in scenario.students}
    for r in records:
        tokens[r.student] += sum(n for t, n in r.token_times() if low <= t < high)
    in_window = [r for r in records if low <= r.sent < high]
    errors: dict[str, int] = {}
    for r in records:
        if r.turn.error:
            errors[r.turn.error] = errors.get(r.turn.error, 0) + 1
    ordinary = [s.name for s in scenario.students if s.name != "heavy"]
    ttfts = [r.turn.ttft_s for r in in_window if r.student in ordinary and r.turn.ttft_s is not None]
    out: dict = {
        "window_s": seconds, "errors": errors, "answers": len(in_window),
        "tokens_per_s": round(sum(tokens.values()) / seconds, 1),
        "tokens_by_student": {k: round(v, 1) for k, v in tokens.items()},
        "ordinary_tokens_per_s": round(sum(tokens[n] for n in ordinary) / seconds, 1),
        "ordinary_ttft_ms": {"p50": _ms(percentile(ttfts, 0.5)), "p95": _ms(percentile(ttfts, 0.95)),
                             "count": len(ttfts)},
        "jain": _round(jain([tokens[s.name] for s in scenario.students]), 4),
    }
    by_group: dict[str, float] = {}
    for s in scenario.students:
        by_group[s.group] = by_group.get(s.group, 0.0) + tokens[s.name]
    out["tokens_by_class"] = {k: round(v, 1) for k, v in by_group.items()}
    if len(scenario.weights) == 2:
        (heavier, _), (lighter, _) = sorted(scenario.weights.items(), key=lambda kv: -kv[1])
        out["class_ratio"] = _round(by_group[heavier] / by_group[lighter] if by_group[lighter] else None, 3)
    if "heavy" in tokens:
        out |= heavy_share(records, ordinary, window)
    return out


def heavy_share(records: list[Record], ordinary: list[str], window: tuple[float, float]) -> dict:
    """The heavy student's share of the tokens that arrived while some ordinary student waited for its first
    token (from sending its question to the first text), within the window."""
    low, high = window
    waits = sorted((max(low, r.sent), min(high, r.sent + r.turn.ttft_s)) for r in records
                   if r.student in ordinary and r.turn.ttft_s is not None and r.sent < high and r.sent + r.turn.ttft_s > low)
    merged: list[list[float]] = []
    for a, b in waits:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])

    def waiting(t: float) -> bool:
        return any(a <= t < b for a, b in merged)

    heavy = everyone = 0.0
    for r in records:
        for t, n in r.token_times():
            if low <= t < high and waiting(t):
                everyone += n
                heavy += n if r.student == "heavy" else 0.0
    overall = sum(n for r in records if r.student == "heavy" for t, n in r.token_times() if low <= t < high)
    total = sum(n for r in records for t, n in r.token_times() if low <= t < high)
    return {"heavy_share_while_waiting": _round(heavy / everyone if everyone else None, 4),
            "waiting_s": round(sum(b - a for a, b in merged), 1),
            "heavy_share_overall": _round(overall / total if total else None, 4)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


class LoadSampler:
    """The 1-minute load average every `every_s` seconds, in a thread, while the scenarios run."""

    def __init__(self, every_s: float = 5.0):
        self.every_s, self.samples, self._stop = every_s, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(round(os.getloadavg()[0], 2))
            self._stop.wait(self.every_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples
        return {"min": min(s), "mean": round(sum(s) / len(s), 2), "max": max(s), "samples": len(s)} if s else {}


def ours_name(keep: str) -> str:
    return "ours" if keep == "default" else f"ours, readers kept {keep} s"


def run_ours(all_scenarios: list[dict[str, Scenario]], args: argparse.Namespace, system_prompt: str,
             keep: str) -> list[dict]:
    path = Path(tempfile.mkstemp(prefix="fairness-classes-", suffix=".toml")[1])
    path.write_text(classes_file([s for rep in all_scenarios for s in rep.values()]))
    server = typewriter_server(SLOTS, 64, args.max_context, args.model)
    server.argv += ["--classes", str(path)]
    if keep != "default":
        server.env = {**(server.env or os.environ), "TYPEWRITER_KEEP_FOR_READERS_S": keep}
    name = ours_name(keep)
    print(f"starting {name} (log {server.log}) ...", file=sys.stderr, flush=True)
    ws_url = f"ws://{HOST}:{server.port}/ws"
    results = []
    with server.start(args.ready_timeout):
        for rep, chosen in enumerate(all_scenarios):
            for scenario in args.scenarios:
                results.append(one(name, rep, chosen[scenario], lambda s: KeyedChat(ws_url, args.params, s.key),
                                   args, system_prompt))
    return results


def run_peer(all_scenarios: list[dict[str, Scenario]], args: argparse.Namespace, system_prompt: str) -> list[dict]:
    binary = args.peer_bin or build_llama_server()
    server = llama_server(binary, args.model or embedded_model(), SLOTS, args.max_context, args.threads, False)
    print(f"starting llama-server (log {server.log}) ...", file=sys.stderr, flush=True)
    results = []
    with server.start(args.ready_timeout):
        for rep, chosen in enumerate(all_scenarios):
            for name in args.scenarios:
                if name in PEER_SCENARIOS:
                    results.append(one("llama-server", rep, chosen[name],
                                       lambda s: LlamaChat(server.http_url, args.params), args, system_prompt))
    return results


def one(server: str, rep: int, scenario: Scenario, make_chat, args: argparse.Namespace, system_prompt: str) -> dict:
    with LoadSampler() as load:
        result = asyncio.run(replay(make_chat, scenario, args, system_prompt))
    result = {"server": server, "repeat": rep, "scenario": scenario.name, "load": load.summary()} | result
    print(f"  {server:<26} r{rep} {scenario.name:<9} {result['tokens_per_s']:6.1f} tokens/s, ordinary TTFT p95 "
          f"{result['ordinary_ttft_ms']['p95']} ms, jain {result['jain']}, ratio {result.get('class_ratio')}, "
          f"heavy share {result.get('heavy_share_while_waiting')}, errors {result['errors'] or 0}, "
          f"load {load.summary().get('mean')}", file=sys.stderr, flush=True)
    return result


def rows(results: list[dict]) -> list[dict]:
    """The five figures per server, each a list over repeats, with its target and whether every repeat met it."""

    def by_repeat(server: str, scenario: str, key: str, sub: str | None = None) -> dict[int, float]:
        out = {}
        for r in results:
            if r["server"] == server and r["scenario"] == scenario:
                v = r[key][sub] if sub else r[key]
                if v is not None:
                    out[r["repeat"]] = v
        return out

    def values(server: str, scenario: str, key: str, sub: str | None = None) -> list[float]:
        return list(by_repeat(server, scenario, key, sub).values())

    def pairs(server: str, key: str, sub: str | None = None) -> list[float]:
        """heavy / class-15 within each repeat (a repeat missing either is left out)."""
        base, heavy = by_repeat(server, "class-15", key, sub), by_repeat(server, "heavy", key, sub)
        return [round(heavy[k] / base[k], 3) for k in sorted(base) if base[k] and k in heavy]

    table = []
    servers = list(dict.fromkeys(r["server"] for r in results))
    for server in servers:
        table += [
            {"row": "a", "server": server, "figure": "ordinary TTFT p95, heavy / class-15", "target": "<= 1.10",
             "values": pairs(server, "ordinary_ttft_ms", "p95"), "ok": lambda v: v <= 1.10},
            {"row": "a", "server": server, "figure": "ordinary tokens/s, heavy / class-15", "target": ">= 0.90",
             "values": pairs(server, "ordinary_tokens_per_s"), "ok": lambda v: v >= 0.90},
            {"row": "b", "server": server, "figure": "heavy student's share while others wait",
             "target": f"<= {2 / SLOTS:.3f} (1/16 + one request)",
             "values": values(server, "heavy", "heavy_share_while_waiting"), "ok": lambda v: v <= 2 / SLOTS},
            {"row": "c", "server": server, "figure": "Jain's index, 16 backlogged students", "target": ">= 0.95",
             "values": values(server, "jain", "jain"), "ok": lambda v: v >= 0.95},
            {"row": "d", "server": server, "figure": "tokens, weight-2 class / weight-1 class", "target": "1.8-2.2",
             "values": values(server, "weights", "class_ratio"), "ok": lambda v: 1.8 <= v <= 2.2},
            {"row": "e", "server": server, "figure": "one student alone, tokens/s", "target": "= llama-server's",
             "values": values(server, "alone", "tokens_per_s"), "ok": None},
        ]
    for row in table:
        ok = row.pop("ok")
        row["met"] = (None if ok is None or not row["values"] or not row["server"].startswith("ours")
                      else all(map(ok, row["values"])))
    peer_alone = by_repeat("llama-server", "alone", "tokens_per_s")
    for server in servers:
        if not server.startswith("ours"):
            continue
        ours_alone = by_repeat(server, "alone", "tokens_per_s")
        ratio = [round(ours_alone[k] / peer_alone[k], 3) for k in sorted(ours_alone) if peer_alone.get(k)]
        if ratio:
            table.append({"row": "e", "server": server, "figure": "one student alone, ours / llama-server tokens/s",
                          "target": "work-conserving (no fairness cost)", "values": ratio, "met": None})
    return [r for r in table if r["values"]]


def markdown(table: list[dict]) -> str:
    lines = ["| row | server | figure | target | per repeat | met |", "|---|---|---|---|---|---|"]
    for r in table:
        met = {True: "yes", False: "no", None: "-"}[r["met"]]
        lines.append(f"| {r['row']} | {r['server']} | {r['figure']} | {r['target']} | "
                     f"{', '.join(str(v) for v in r['values'])} | {met} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    def seconds_range(text: str) -> tuple[float, float]:
        low, _, high = text.partition(",")
        return float(low), float(high or low)

    p = argparse.ArgumentParser(prog="bench/fairness.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS), type=lambda t: t.split(","), metavar="A,B,...",
                   help=f"which to run, in order (default {','.join(SCENARIOS)})")
    p.add_argument("--repeats", type=int, default=2, metavar="N", help="runs of every scenario (default 2)")
    p.add_argument("--window", type=float, default=30.0, metavar="S",
                   help="seconds measured per scenario, after the warm-up (default 30)")
    p.add_argument("--alone-window", type=float, default=15.0, metavar="S", help="the same for (e) (default 15)")
    p.add_argument("--warmup", type=float, default=5.0, metavar="S", help="seconds not measured first (default 5)")
    p.add_argument("--pause", type=seconds_range, default=(0.5, 1.5), metavar="LOW,HIGH",
                   help="an ordinary student's reading pause, uniform in seconds (default 0.5,1.5)")
    p.add_argument("--max-new-tokens", type=int, default=48, metavar="N", help="answer length (default 48)")
    p.add_argument("--request-timeout", type=float, default=120.0, metavar="S")
    p.add_argument("--servers", choices=["both", "ours", "peer"], default="both")
    p.add_argument("--keep-for-readers", default=["default"], type=lambda t: t.split(","), metavar="S,S,...",
                   help="run our server once with each TYPEWRITER_KEEP_FOR_READERS_S (`default`: unset; default "
                        "default)")
    p.add_argument("--max-context", type=int, default=1024, metavar="N", help="context per slot (default 1024)")
    p.add_argument("--model", metavar="PATH", help="the GGUF file both serve (default: the embedded model)")
    p.add_argument("--peer-bin", metavar="PATH", help="a llama-server binary (default: scripts/build-llama-server.sh's)")
    p.add_argument("--threads", type=int, default=2, metavar="N", help="llama-server -t (default 2)")
    p.add_argument("--ready-timeout", type=float, default=900.0, metavar="S")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, metavar="PATH", help="also write every number as JSON here")
    args = p.parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        p.error(f"--scenarios: unknown {sorted(unknown)}; known {SCENARIOS}")
    args.params = Params(args.max_new_tokens, args.request_timeout)
    return args


def main() -> int:
    from typewriter.text.tokenizer import DEFAULT_SYSTEM_PROMPT

    args = parse_args()
    chosen = [scenarios(rep, args.pause) for rep in range(args.repeats)]
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S"), os.getloadavg()
    results = []
    if args.servers in ("both", "ours"):
        for keep in args.keep_for_readers:
            results += run_ours(chosen, args, DEFAULT_SYSTEM_PROMPT, keep)
    if args.servers in ("both", "peer"):
        results += run_peer(chosen, args, DEFAULT_SYSTEM_PROMPT)
    table = rows(results)
    print(markdown(table))
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "params"} | {"slots": SLOTS, "started": started,
                                                                            "load_before": load_before}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": config, "rows": table, "runs": results}, indent=2,
                                        default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
