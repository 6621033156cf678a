"""The `typewriter` command: generate, chat, bench and serve."""

from __future__ import annotations

import argparse
import sys

from .errors import TypewriterError


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="a GGUF file or a Hugging Face model directory "
                   "(default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--max-context", type=int, default=2048, metavar="N",
                   help="tokens of KV cache per stream (default 2048)")


DEFAULT_MAX_NEW_TOKENS = 512


def add_sampling_arguments(p: argparse.ArgumentParser, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> None:
    p.add_argument("--system", help="system prompt (default: a patient tutor)")
    p.add_argument("--max-new-tokens", type=int, metavar="N",
                   help=f"answer length limit (default {max_new_tokens}, or what the context has room for)")
    p.add_argument("--temperature", type=float, default=0.2, help="0 means greedy (default 0.2)")
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=0, help="0 means off")
    p.add_argument("--repetition-penalty", type=float, default=1.1, help="1 means off (default 1.1)")
    p.add_argument("--seed", type=int, help="makes a sampled answer reproducible")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop sequence (repeatable)")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="deadline for the answer")


def sampling_params(args: argparse.Namespace, room: int | None = None):
    """The request's sampling parameters; without --max-new-tokens, the default shrinks to the `room` left in
    the context, while an explicit value that does not fit is an error."""
    from .request import SamplingParams

    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = DEFAULT_MAX_NEW_TOKENS if room is None else max(1, min(DEFAULT_MAX_NEW_TOKENS, room))
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
        timeout_s=args.timeout,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="typewriter", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="stream one answer to stdout")
    gen.add_argument("prompt")
    gen.add_argument("--raw", action="store_true", help="no chat template: continue PROMPT as plain text")
    gen.add_argument("--json", action="store_true", help="one JSON object per line: tokens, then the end")
    add_model_arguments(gen)
    add_sampling_arguments(gen)

    chat = sub.add_parser("chat", help="interactive multi-turn chat; Ctrl-C stops an answer, Ctrl-D leaves")
    add_model_arguments(chat)
    add_sampling_arguments(chat)

    bench = sub.add_parser("bench", help="measure load, compile, time to first token and decode speed")
    add_model_arguments(bench)
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--tokens", type=int, default=256, help="decode tokens to time (default 256)")
    bench.add_argument("--streams", type=int, default=4, help="concurrent streams for the batched run (default 4)")
    bench.add_argument("--url", help="benchmark a running server's WebSocket (ws://HOST:PORT/ws) instead")
    from .loadbench import add_url_bench_arguments

    add_url_bench_arguments(bench)

    serve = sub.add_parser("serve", help="start the WebSocket chat server")
    from .server.main import add_serve_arguments

    add_serve_arguments(serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .config import quiet_native_logs

    quiet_native_logs()
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            from .commands import generate

            return generate.run(args)
        if args.command == "chat":
            from .commands import chat

            return chat.run(args)
        if args.command == "bench":
            if args.url:
                from .loadbench import run_url_bench

                return run_url_bench(args)
            from . import bench

            return bench.run(args)
        if args.command == "serve":
            from .server.main import run_serve

            return run_serve(args)
    except TypewriterError as e:
        print(f"typewriter: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2
