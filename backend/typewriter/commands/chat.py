"""`typewriter chat`: an interactive multi-turn chat that streams; Ctrl-C stops an answer, Ctrl-D leaves."""

from __future__ import annotations

import argparse
import dataclasses
import queue
import sys
import uuid
from typing import TYPE_CHECKING

from ..config import DEFAULT_MAX_NEW_TOKENS, Settings
from ..engine.request import Event, Finished, GenerationRequest, SamplingParams, Token
from ..errors import TypewriterError
from ..progress import StderrProgress
from ..text.conversation import fit_conversation
from .args import add_model_arguments, add_sampling_arguments, check_model_arguments, sampling_params

if TYPE_CHECKING:  # the parser imports no numpy
    from ..engine.engine import Engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_sampling_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..assemble import load
    from ..config import lite_cache_dir

    check_model_arguments(args)  # bad values fail before the model loads
    sampling_params(args, context=args.max_context)
    # One question at a time, and a stopped answer has ended before the next question is sent, so the one
    # slot is always free and nothing ever waits in a queue.
    engine, tokenizer, _ = load(args.model, slots=1, max_context=args.max_context, max_queue=0,
                                prefill_budget=Settings().engine.prefill_budget,
                                draft_tokens=Settings().engine.draft_tokens, progress=StderrProgress(),
                                compile="lazy", weight_format=args.weights,  # only what this request needs
                                program_cache=lite_cache_dir())
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
            try:  # a long chat leaves out its oldest turns, as the server does
                fitted = fit_conversation(history, lambda m: tokenizer.encode_chat(m, system=args.system),
                                          engine.max_context, DEFAULT_MAX_NEW_TOKENS, args.max_new_tokens)
                if fitted.dropped_messages:
                    print(f"[{fitted.dropped_messages} older messages left out to fit the context]", file=sys.stderr)
                params = dataclasses.replace(sampling_params(args, repetition_penalty=engine.repetition_penalty),
                                             max_new_tokens=fitted.max_new_tokens)
                history.append({"role": "assistant", "content": _answer(engine, fitted.prompt_ids, params)})
            except TypewriterError as e:  # prompt_too_long: this question alone is too long; the chat goes on
                print(f"[{e.code}: {e}]", file=sys.stderr)
                history.pop()
    finally:
        engine.shutdown()


def _answer(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> str:
    """Stream one answer; returns its text, partial if Ctrl-C stopped it."""
    request = GenerationRequest(uuid.uuid4().hex, prompt_ids, params)
    engine.prepare(request)
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    engine.submit(request, events.put)
    parts: list[str] = []
    sys.stdout.write("tutor> ")
    sys.stdout.flush()
    try:
        while not isinstance(event := events.get(), Finished):
            if isinstance(event, Token):
                parts.append(event.text)
                sys.stdout.write(event.text)
                sys.stdout.flush()
        if event.error:
            print(f"\n[error: {event.error}]", file=sys.stderr)
    except KeyboardInterrupt:
        engine.cancel(request.id)
        while not isinstance(events.get(), Finished):  # its slot is free once it has ended
            pass
        sys.stdout.write("\n[stopped]")
    sys.stdout.write("\n")
    return "".join(parts)
