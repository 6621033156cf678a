"""`typewriter chat`: an interactive multi-turn chat that streams; Ctrl-C stops an answer, Ctrl-D leaves."""

from __future__ import annotations

import argparse
import sys
import uuid

from ..cli import sampling_params
from ..errors import TypewriterError
from ..progress import StderrProgress
from ..request import Finished, GenerationRequest, Token


def run(args: argparse.Namespace) -> int:
    from ..runtime import load
    from ..tokenizer import DEFAULT_SYSTEM_PROMPT

    sampling_params(args)  # bad values fail before the model loads
    engine, tokenizer, _ = load(args.model, 1, args.max_context, progress=StderrProgress())
    system = args.system or DEFAULT_SYSTEM_PROMPT
    history: list[dict[str, str]] = []
    print("Type a question. Ctrl-C stops an answer, Ctrl-D leaves.", file=sys.stderr)
    try:
        while True:
            try:
                question = input("you> ")
            except EOFError:
                print(file=sys.stderr)
                return 0
            except KeyboardInterrupt:
                print(file=sys.stderr)
                continue
            if not question.strip():
                continue
            history.append({"role": "user", "content": question})
            prompt_ids = tokenizer.encode_chat(history, system=system)
            params = sampling_params(args, room=engine.max_context - len(prompt_ids))
            answer = _answer(engine, prompt_ids, params)
            if answer is None:
                history.pop()
            else:
                history.append({"role": "assistant", "content": answer})
    finally:
        engine.shutdown()


def _answer(engine, prompt_ids: list[int], params) -> str | None:
    """Stream one answer; returns its text (partial if stopped), or None if it could not start."""
    parts: list[str] = []
    request = GenerationRequest(uuid.uuid4().hex, prompt_ids, params)
    sys.stdout.write("tutor> ")
    sys.stdout.flush()
    try:
        events = engine.stream(request)
        for event in events:
            if isinstance(event, Token):
                parts.append(event.text)
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Finished) and event.error:
                print(f"\n[error: {event.error}]", file=sys.stderr)
    except KeyboardInterrupt:
        events.close()  # cancels the request on the engine thread
        sys.stdout.write("\n[stopped]")
    except TypewriterError as e:
        print(f"\n[{e.code}: {e}]", file=sys.stderr)
        return None
    sys.stdout.write("\n")
    return "".join(parts)
