"""`typewriter generate PROMPT`: stream one answer to stdout, as text or as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

from ..cli import sampling_params
from ..progress import StderrProgress
from ..request import Finished, GenerationRequest, Token


def run(args: argparse.Namespace) -> int:
    from ..runtime import load
    from ..tokenizer import DEFAULT_SYSTEM_PROMPT

    sampling_params(args)  # bad values fail before the model loads
    t0 = time.perf_counter()
    engine, tokenizer, times = load(args.model, 1, args.max_context, progress=StderrProgress())
    try:
        if args.raw:
            prompt_ids = tokenizer.encode(args.prompt)
        else:
            messages = [{"role": "user", "content": args.prompt}]
            prompt_ids = tokenizer.encode_chat(messages, system=args.system or DEFAULT_SYSTEM_PROMPT)
        load_ms = (time.perf_counter() - t0) * 1000
        params = sampling_params(args, room=engine.max_context - len(prompt_ids))
        request = GenerationRequest(uuid.uuid4().hex, prompt_ids, params)
        for event in engine.stream(request):
            if isinstance(event, Token):
                if args.json:
                    line = {"type": "token", "index": event.index, "token_id": event.token_id, "text": event.text}
                    print(json.dumps(line, ensure_ascii=False), flush=True)
                else:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            elif isinstance(event, Finished):
                if args.json:
                    print(json.dumps(end_line(event, load_ms), ensure_ascii=False), flush=True)
                else:
                    sys.stdout.write("\n")
                    print(f"[{event.reason.value}: {event.completion_tokens} tokens, "
                          f"{event.timings.tokens_per_s:.1f} tokens/s]", file=sys.stderr)
                return 1 if event.error else 0
    finally:
        engine.shutdown()
    return 1


def end_line(event: Finished, load_ms: float) -> dict:
    line = {
        "type": "end",
        "reason": event.reason.value,
        "usage": {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens},
        "timings": {
            "load_ms": round(load_ms, 1),
            "ttft_ms": round(event.timings.ttft_ms, 1),
            "tokens_per_s": round(event.timings.tokens_per_s, 2),
        },
    }
    if event.error:
        line["error"] = event.error
    return line
