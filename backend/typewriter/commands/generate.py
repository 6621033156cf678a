"""`typewriter generate PROMPT`: stream one answer to stdout, as text or as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from ..config import Settings
from ..engine.request import Finished, GenerationRequest, Token
from ..progress import StderrProgress
from ..text.conversation import check_question
from .args import add_model_arguments, add_sampling_arguments, check_model_arguments, sampling_params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt")
    parser.add_argument("--raw", action="store_true", help="no chat template: continue PROMPT as plain text")
    parser.add_argument("--json", action="store_true", help="one JSON object per line: tokens, then the end")
    add_model_arguments(parser)
    add_sampling_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..assemble import load
    from ..config import lite_cache_dir

    check_question(args.prompt, "prompt")  # bad values fail before the model loads
    check_model_arguments(args)
    sampling_params(args, context=args.max_context)
    t0 = time.perf_counter()
    # One request at a time: it always finds the one slot free, so nothing ever waits in a queue.
    engine, tokenizer, _ = load(args.model, slots=1, max_context=args.max_context, max_queue=0,
                                prefill_budget=Settings().engine.prefill_budget,
                                draft_tokens=Settings().engine.draft_tokens, progress=StderrProgress(),
                                compile="lazy", weight_format=args.weights,  # only what this request needs
                                program_cache=lite_cache_dir())
    try:
        if args.raw:
            prompt_ids = tokenizer.encode(args.prompt)
        else:
            prompt_ids = tokenizer.encode_chat([{"role": "user", "content": args.prompt}], system=args.system)
        load_ms = (time.perf_counter() - t0) * 1000
        params = sampling_params(args, len(prompt_ids), engine.max_context,  # PromptTooLong: exit 2
                                 engine.repetition_penalty)
        request = GenerationRequest(uuid.uuid4().hex, prompt_ids, params)
        engine.prepare(request)
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


def end_line(event: Finished, load_ms: float) -> dict[str, Any]:
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
