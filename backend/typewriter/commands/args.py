"""The options several commands share. Defaults are read from `SamplingParams` and config.py, never copied, so that
help text and behaviour change with them.
"""

from __future__ import annotations

import argparse

from ..config import DEFAULT_MAX_NEW_TOKENS, EMBEDDED_MODEL_ID, ENV_PREFIX, WEIGHT_FORMATS, ConfigError, Settings
from ..engine.request import SMALL_MODEL_PARAMETERS, SamplingParams
from ..errors import InvalidRequest
from ..text.conversation import fit_max_new_tokens

# The SamplingParams fields that are options; each option's dest is the field's name.
SAMPLING_OPTIONS = ("max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop",
                    "timeout_s")


def setting_default(name: str) -> object:
    """The default of a setting (its flat name), as config.py declares it."""
    return Settings().flat()[name]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_model_arguments(p: argparse.ArgumentParser, from_settings: bool = False, weights: bool = True) -> None:
    """--model, --max-context and --weights. With `from_settings` they stay None when not given, so Settings
    fills them from TYPEWRITER_* variables or its own defaults. `weights` False leaves --weights out."""
    context, default_weights = setting_default("max_context"), setting_default("weights")
    model_var, context_var, weights_var = ((f"; {ENV_PREFIX}MODEL_PATH", f"; {ENV_PREFIX}MAX_CONTEXT",
                                            f"; {ENV_PREFIX}WEIGHTS") if from_settings else ("", "", ""))
    p.add_argument("--model", metavar="PATH", help="a GGUF file, a Hugging Face model directory or a SavedModel "
                   "from `typewriter export`; `typewriter models` lists the families that load "
                   f"(default: the embedded {EMBEDDED_MODEL_ID}{model_var})")
    p.add_argument("--max-context", type=int, default=None if from_settings else context, metavar="N",
                   help=f"tokens of KV cache per stream (default {context}{context_var})")
    if weights:
        p.add_argument("--weights", choices=WEIGHT_FORMATS, default=None if from_settings else default_weights,
                       help=f"how the matrices are held: q4-blocks runs a GGUF file's own blocks in C (Llama "
                       f"models; the fast one where the CPU has AVX-512 VNNI, held once in about the file's bytes), "
                       f"int8-lite int8 LiteRT programs (Llama models; -fast trades some quality for faster "
                       f"batches), fp32 exactly the file's, XLA's int8 4x fewer bytes than fp32 but slower for one "
                       f"row; auto is q4-blocks on AVX-512 VNNI, else int8-lite for Llama models, else fp32 "
                       f"(default {default_weights}{weights_var})")


def check_model_arguments(args: argparse.Namespace) -> None:
    """Refuse, before the model loads, the values `serve` would refuse, naming the option."""
    try:
        Settings.of(max_context=args.max_context)
    except ConfigError as e:
        raise e.given_as("--max-context") from None


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """Every option defaults to None: only the values given reach SamplingParams, which has the defaults."""
    d = SamplingParams()
    p.add_argument("--system", metavar="TEXT", help='system prompt (default: a patient tutor; "" for none)')
    p.add_argument("--max-new-tokens", type=int, metavar="N",
                   help=f"answer length limit (default {DEFAULT_MAX_NEW_TOKENS}, or what the context has room for)")
    p.add_argument("--temperature", type=float, help=f"0 means greedy (default {d.temperature})")
    p.add_argument("--top-p", type=float, help=f"sample from the likeliest tokens that make up this much probability "
                   f"(default {d.top_p})")
    p.add_argument("--top-k", type=int, help=f"sample from the K likeliest tokens; 0 means off (default {d.top_k})")
    p.add_argument("--repetition-penalty", type=float, help=f"1 means off (default: the model's, {d.repetition_penalty} "
                   f"under {SMALL_MODEL_PARAMETERS / 1e9:.1f}B weights, else 1)")
    p.add_argument("--seed", type=int, help="makes a sampled answer reproducible")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop sequence (repeatable)")
    p.add_argument("--timeout", dest="timeout_s", type=float, metavar="SECONDS", help="deadline for the answer")


def sampling_params(args: argparse.Namespace, prompt_tokens: int | None = None,
                    context: int | None = None, repetition_penalty: float | None = None) -> SamplingParams:
    """Without the prompt's length (checking before the model loads) the answer length is as asked; with it, the
    server's `fit_max_new_tokens` decides, raising PromptTooLong when the context has too little room left.
    `repetition_penalty`: the loaded model's default (`engine.repetition_penalty`), unless the option is given."""
    given = {name: getattr(args, name) for name in SAMPLING_OPTIONS if getattr(args, name) is not None}
    if repetition_penalty is not None:
        given.setdefault("repetition_penalty", repetition_penalty)
    if prompt_tokens is None and context is not None and (args.max_new_tokens or 0) >= context:
        raise InvalidRequest("max_new_tokens", f"must be smaller than the context ({context} tokens, --max-context)"
                                               f" so that a prompt fits, got {args.max_new_tokens}")
    if prompt_tokens is not None and context is not None:
        given["max_new_tokens"] = fit_max_new_tokens(prompt_tokens, context, DEFAULT_MAX_NEW_TOKENS,
                                                     args.max_new_tokens)
    return SamplingParams(**given)
