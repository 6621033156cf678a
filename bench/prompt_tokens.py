"""Do we and llama.cpp hand the model the same prompt? For the same messages, the token ids our tokenizer builds
(text/tokenizer.py's encode_chat, as the server encodes a chat) against those llama-server builds with `--jinja`
(its /apply-template, then /tokenize with special tokens added and parsed, as its chat completions do), on the
same GGUF file; split into the two places they can part: the chat template's text, and the tokenizer's ids for
the same text.

    .venv/bin/python bench/prompt_tokens.py [--model PATH] [--per-language 40] [--json artifacts/prompt-tokens.json]

The messages are bench/correctness.py's (the tutor's system prompt and a GSM8K problem in English, Spanish and
Chinese), plus the same problems without a system message (where both render the template's own default system
turn) and as the second turn of a conversation. Printed: how
many prompts are the same text and the same ids, and the first difference of each that is not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
from classroom_servers import build_llama_server, embedded_model
from correctness import GSM8K, llama_server, load_problems


def first_difference(a: list, b: list) -> int | None:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if n == len(a) == len(b) else n


def conversations(problems: list[dict], system: str) -> list[tuple[str, list[dict]]]:
    out = []
    for p in problems:
        question = {"role": "user", "content": p["question"]}
        out.append((f"{p['id']} tutor", [{"role": "system", "content": system}, question]))
        out.append((f"{p['id']} no-system", [question]))
    first = problems[0]["question"]
    for p in problems[1:4]:
        out.append((f"{p['id']} second-turn", [
            {"role": "system", "content": system}, {"role": "user", "content": first},
            {"role": "assistant", "content": "Let's work it out together. What do we know?"},
            {"role": "user", "content": p["question"]}]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--per-language", type=int, default=40, help="English problems (the translated: all 40)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from typewriter.text.tokenizer import DEFAULT_SYSTEM_PROMPT, Tokenizer

    model = args.model or embedded_model()
    tokenizer = Tokenizer.from_gguf(model)
    problems = load_problems(["en", "es", "zh"], args.per_language, 0, GSM8K)
    cases = conversations(problems, DEFAULT_SYSTEM_PROMPT)
    rows = []
    with llama_server(build_llama_server(), model, 1, 4096, 2).start(timeout_s=300) as server:
        with httpx.Client(base_url=server.http_url, timeout=60) as http:
            for name, messages in cases:
                theirs_text = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
                theirs = http.post("/tokenize", json={"content": theirs_text, "add_special": True,
                                                      "parse_special": True}).json()["tokens"]
                # without a system message our server adds the tutor's; "" asks for the template's own default
                system = "" if name.endswith("no-system") else None
                ours_text = tokenizer.render_chat(messages, system)
                ours = tokenizer.encode_chat(messages, system)
                ours_of_theirs = tokenizer.encode(theirs_text)
                text_at = first_difference(list(ours_text), list(theirs_text))
                ids_at = first_difference(ours, theirs)
                tok_at = first_difference(ours_of_theirs, theirs)
                row = {"case": name, "same_text": text_at is None, "same_ids": ids_at is None,
                       "same_tokenizer": tok_at is None, "ours_tokens": len(ours), "theirs_tokens": len(theirs)}
                if text_at is not None:
                    row["text_ours"] = ours_text[max(0, text_at - 40):text_at + 40]
                    row["text_theirs"] = theirs_text[max(0, text_at - 40):text_at + 40]
                if ids_at is not None:
                    row["ids_ours"] = ours[max(0, ids_at - 3):ids_at + 5]
                    row["ids_theirs"] = theirs[max(0, ids_at - 3):ids_at + 5]
                    row["ids_at"] = ids_at
                if tok_at is not None:
                    row["tokenizer_ours"] = [tokenizer.decode([i], skip_special_tokens=False)
                                             for i in ours_of_theirs[max(0, tok_at - 2):tok_at + 4]]
                    row["tokenizer_theirs"] = [tokenizer.decode([i], skip_special_tokens=False)
                                               for i in theirs[max(0, tok_at - 2):tok_at + 4]]
                rows.append(row)
        # one real chat completion: the prompt it counts is the one /tokenize gave
        messages = cases[0][1]
        counted = httpx.post(f"{server.http_url}/v1/chat/completions", timeout=120, json={
            "messages": messages, "max_tokens": 1, "temperature": 0}).json()["usage"]["prompt_tokens"]
    result = {"model": model, "cases": len(rows), "same_text": sum(r["same_text"] for r in rows),
              "same_ids": sum(r["same_ids"] for r in rows), "same_tokenizer": sum(r["same_tokenizer"] for r in rows),
              "chat_completion_prompt_tokens": counted, "tokenize_prompt_tokens": rows[0]["theirs_tokens"],
              "rows": rows}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    for row in rows:
        if not (row["same_text"] and row["same_ids"]):
            print(json.dumps(row, ensure_ascii=False))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
