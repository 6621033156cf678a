"""CPU time the server spends fitting one chat frame into the context (text/conversation.py), before and after the
cut was searched: the way the server calls it (the embedded model's tokenizer, its chat template, the default
context and answer length), for ordinary frames and for frames built to cost the most within the limits.

    .venv/bin/python bench/fit_cost.py [--context 2048] [--repeat 3]

"before" is the fitting as it was (the whole history encoded again for every exchange it dropped), kept here
as the reference; "after" is fit_conversation with the tokenizer's `count`. Each figure is the median process
CPU time of --repeat runs, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from typewriter.errors import PromptTooLong
from typewriter.text.conversation import FittedPrompt, fit_conversation, fit_max_new_tokens
from typewriter.text.tokenizer import Tokenizer
from typewriter.weights.source import embedded_model_path

LIMIT = 256 * 1024  # max_message_bytes: a frame of the size limit, less room for the JSON around the messages


def before(messages, encode, context, default):
    """The fitting as it was."""
    head = [m for m in messages[:1] if m["role"] == "system"]
    rest = list(messages[len(head):])
    want = min(default, context // 2)
    prompt = encode(head + rest)
    dropped = 0
    if len(prompt) + want > context and len(rest) > 1:
        target = context - context // 4
        while len(rest) > 1 and len(prompt) + want > target:
            cut = 2 if len(rest) > 2 else 1
            rest, dropped = rest[cut:], dropped + cut
            prompt = encode(head + rest)
    return FittedPrompt(prompt, fit_max_new_tokens(len(prompt), context, default), dropped)


def filler(kind: str, size: int, rng: random.Random) -> str:
    """`size` characters of text the tokenizer finds ordinary, or costly: a token a digit, or long runs."""
    if kind == "words":
        return " ".join(rng.choice(["the", "fraction", "photosynthesis", "why", "is", "a"]) for _ in range(size))[:size]
    if kind == "digits":
        return "".join(rng.choice("0123456789") for _ in range(size))
    return "#" * size


def frames(context: int) -> dict[str, list[dict]]:
    rng = random.Random(31)

    def chat(n: int, kind: str, size: int) -> list[dict]:
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": filler(kind, size, rng)}
                 for i in range(n - 1)]
        return turns + [{"role": "user", "content": "And what is a fraction?"}]

    per_message = (LIMIT - 127 * 40) // 127
    return {
        "a question": chat(1, "words", 0),
        "a conversation filling the context": chat(24, "words", context * 4 // 30),
        "127 messages of words, 245 KB": chat(127, "words", per_message),
        "127 messages of digits, 245 KB": chat(127, "digits", per_message),
        "127 messages of '#', 245 KB": chat(127, "#", per_message),
        "one question of digits, 250 KB": [{"role": "user", "content": filler("digits", LIMIT - 1000, rng)}],
    }


def cpu_ms(fit, repeat: int) -> tuple[float, str]:
    times, outcome = [], ""
    for _ in range(repeat):
        started = time.process_time()
        try:
            fitted = fit()
            outcome = f"{len(fitted.prompt_ids)} tokens, {fitted.dropped_messages} dropped"
        except PromptTooLong:
            outcome = "prompt_too_long"
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times), outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--default", type=int, default=512, help="the answer length when a chat asks none")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    tok = Tokenizer.load(embedded_model_path())

    def encode(messages):
        return tok.encode_chat(messages, None)

    rows = []
    for name, messages in frames(args.context).items():
        old_ms, old = cpu_ms(lambda: before(messages, encode, args.context, args.default), args.repeat)
        new_ms, new = cpu_ms(lambda: fit_conversation(messages, encode, args.context, args.default, None, tok.count),
                             args.repeat)
        rows.append({"frame": name, "bytes": len(json.dumps(messages).encode()), "before_ms": round(old_ms, 1),
                     "after_ms": round(new_ms, 1), "before": old, "after": new})
        print(f"{name:<36} {rows[-1]['bytes']:>8} B  before {old_ms:8.1f} ms  after {new_ms:6.1f} ms  ({new})",
              flush=True)
    print(json.dumps({"context": args.context, "default": args.default, "rows": rows}))


if __name__ == "__main__":
    main()
