"""What a tutor's answers look like, before and after a change to the system prompt or the loop guard: on a set of
tutoring questions in six languages, how many answers loop, how many come back in the question's language, and
how many maths answers write their formulas in LaTeX and code answers their code in a Markdown block.

    .venv/bin/pip install py3langid              # the language identifier (its model ships in the package)
    .venv/bin/python bench/tutor_answers.py --json artifacts/tutor-answers.json
    .venv/bin/python bench/tutor_answers.py --model "$(scripts/fetch-qwen-0.5b.sh)"

Each configuration answers every question in-process (the server's defaults: temperature 0.2, top-p 0.9,
repetition penalty 1.1, seeded for repeatability; 320 new tokens at most), through one engine with 8 slots:
  before   the previous default system prompt (PREVIOUS_PROMPT below), the loop guard off
  prompt   the current default system prompt, the loop guard off
  after    the current default system prompt and the loop guard on (the server's defaults today)
An answer "loops" when its reason is `repetition`, or, with the guard off, when the guard would have tripped on
its tokens (engine/repetition.py, run over them afterwards). The language is py3langid's guess over the answer's
text with formulas and code left out.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

PREVIOUS_PROMPT = (
    "You are a patient, encouraging tutor for students. Explain ideas step by step in plain language, "
    "check that the student understands before moving on, and ask what they have already tried. "
    "Do not just hand over answers to homework: guide the student to work them out, and praise real progress."
)
# (language, kind, question): kind "math" expects LaTeX, "code" a fenced block, "prose" neither
QUESTIONS = [
    ("en", "math", "How do I solve the equation 2x + 3 = 11?"),
    ("en", "math", "Why is the area of a circle pi times r squared?"),
    ("en", "code", "How do I reverse a list in Python?"),
    ("en", "prose", "What causes the seasons on Earth?"),
    ("es", "math", "¿Cómo resuelvo la ecuación 3x - 5 = 10?"),
    ("es", "math", "¿Qué dice el teorema de Pitágoras?"),
    ("es", "code", "¿Cómo sumo los números de una lista en Python?"),
    ("es", "prose", "¿Por qué el cielo es azul?"),
    ("zh", "math", "怎么解方程 5x + 2 = 17？"),
    ("zh", "math", "什么是勾股定理？"),
    ("zh", "code", "怎么用 Python 打印从 1 到 10 的数字？"),
    ("zh", "prose", "植物是怎样进行光合作用的？"),
    ("fr", "math", "Comment calculer la dérivée de x au carré ?"),
    ("fr", "math", "Comment résoudre l'équation 4x = 20 ?"),
    ("fr", "code", "Comment écrire une boucle for en Python ?"),
    ("fr", "prose", "Pourquoi la Lune change-t-elle de forme ?"),
    ("de", "math", "Wie löse ich die Gleichung x² = 49?"),
    ("de", "math", "Was ist der Satz des Pythagoras?"),
    ("de", "code", "Wie lese ich eine Datei in Python?"),
    ("de", "prose", "Warum gibt es Ebbe und Flut?"),
    ("pt", "math", "Como resolvo a equação 2x + 4 = 12?"),
    ("pt", "math", "O que é uma fração equivalente?"),
    ("pt", "code", "Como faço para ordenar uma lista em Python?"),
    ("pt", "prose", "Por que as folhas das árvores são verdes?"),
]
CONFIGS = {"before": (PREVIOUS_PROMPT, False), "prompt": (None, False), "after": (None, True)}
LATEX = re.compile(r"\$[^$\n]+\$|\\\(|\\\[|\$\$")
FENCE = re.compile(r"```")
LEFT_OUT = re.compile(r"```.*?```|\$\$.*?\$\$|\$[^$\n]*\$|\\\(.*?\\\)|\\\[.*?\\\]|`[^`]*`", re.S)


def language(text: str) -> str:
    import py3langid

    prose = LEFT_OUT.sub(" ", text)
    return py3langid.classify(prose)[0] if prose.strip() else "none"


def would_loop(token_ids: list[int]) -> bool:
    from typewriter.engine.repetition import LoopGuard

    guard = LoopGuard()
    return any(guard.push(t) for t in token_ids)


def collect(engine, requests) -> list[dict]:
    """Every request's text, token ids and finish reason, all submitted at once."""
    import threading

    from typewriter.engine.request import Finished, Token

    results = {r.id: {"text": "", "token_ids": [], "reason": None} for r in requests}
    done = threading.Semaphore(0)

    def on_event(event) -> None:
        got = results[event.request_id]
        if isinstance(event, Token):
            got["text"] += event.text
            got["token_ids"].append(event.token_id)
        elif isinstance(event, Finished):
            got["reason"] = event.reason.value
            done.release()

    for r in requests:
        engine.submit(r, on_event)
    for _ in requests:
        done.acquire()
    return [results[r.id] for r in requests]


def answer_all(engine, tokenizer, system: str | None, loop_guard: bool, max_new_tokens: int) -> list[dict]:
    from typewriter.engine.request import GenerationRequest, SamplingParams

    requests = []
    for i, (_, _, question) in enumerate(QUESTIONS):
        ids = tokenizer.encode_chat([{"role": "user", "content": question}], system=system)
        params = SamplingParams(max_new_tokens=max_new_tokens, seed=1000 + i, loop_guard=loop_guard)
        requests.append(GenerationRequest(f"q{i}", ids, params))
    return collect(engine, requests)


def score(results: list[dict], guarded: bool) -> dict:
    rows = []
    for (lang, kind, question), r in zip(QUESTIONS, results):
        text = r["text"]
        looped = r["reason"] == "repetition" or (not guarded and would_loop(r["token_ids"]))
        rows.append({"question": question, "language": lang, "kind": kind, "reason": r["reason"],
                     "tokens": len(r["token_ids"]), "looped": looped, "answered_in": language(text),
                     "latex": bool(LATEX.search(text)), "code_block": bool(FENCE.search(text)), "text": text})
    maths = [r for r in rows if r["kind"] == "math"]
    code = [r for r in rows if r["kind"] == "code"]
    return {
        "answers": len(rows),
        "looped": sum(r["looped"] for r in rows),
        "in_the_questions_language": sum(r["answered_in"] == r["language"] for r in rows),
        "non_english_in_their_language": sum(r["answered_in"] == r["language"] for r in rows if r["language"] != "en"),
        "non_english": sum(r["language"] != "en" for r in rows),
        "maths_with_latex": f"{sum(r['latex'] for r in maths)} of {len(maths)}",
        "code_in_a_block": f"{sum(r['code_block'] for r in code)} of {len(code)}",
        "mean_tokens": round(sum(r["tokens"] for r in rows) / len(rows), 1),
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", help="a GGUF file or HF directory (default: the embedded model)")
    parser.add_argument("--max-new-tokens", type=int, default=320)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    try:
        import py3langid  # noqa: F401
    except ImportError:
        print("bench/tutor_answers.py needs py3langid: .venv/bin/pip install py3langid", file=sys.stderr)
        return 2
    from typewriter.runners.xla.tf_env import prepare_environment

    prepare_environment(None)
    from typewriter.assemble import load
    from typewriter.config import lite_cache_dir

    engine, tokenizer, _ = load(args.model, slots=8, max_context=2048, max_queue=len(QUESTIONS),
                                prefill_budget=16, program_cache=lite_cache_dir())
    result = {"model": engine.model_name, "max_new_tokens": args.max_new_tokens, "configs": {}}
    try:
        for name, (system, guard) in CONFIGS.items():
            t0 = time.perf_counter()
            scored = score(answer_all(engine, tokenizer, system, guard, args.max_new_tokens), guard)
            scored["seconds"] = round(time.perf_counter() - t0, 1)
            result["configs"][name] = scored
            summary = {k: v for k, v in scored.items() if k != "rows"}
            print(json.dumps({"config": name, **summary}, ensure_ascii=False), flush=True)
    finally:
        engine.shutdown()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
