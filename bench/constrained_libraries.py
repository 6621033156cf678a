"""Which constrained-decoding library the engine uses, measured on our vocabularies (SmolLM2's 49,152 tokens and
Qwen2.5's 151,936): the time to compile each schema, and the time to compute a token mask (and apply it to a row
of logits) per token while a valid answer is fed token by token, at batch 1 and 16. Each candidate builds its
tokenizer view from the bytes of each token, as the engine would (no transformers, no torch).

    .venv/bin/python bench/constrained_libraries.py [--repeats 5] [--libraries llguidance,outlines-core,formatron]
        [--vocabularies smollm2,qwen] > artifacts/constrained-libraries.jsonl

One JSON line per (library, vocabulary, schema, measure). xgrammar is not a candidate: its package imports torch
at import time (docs/measurements/2026-12-04-constrained-decoding-libraries.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

QWEN = Path(os.environ.get("TYPEWRITER_BENCH_CACHE", Path.home() / ".cache/typewriter")) / "models" \
    / "qwen2.5-coder-0.5b-instruct.gguf"

QUIZ = {"type": "object", "additionalProperties": False, "required": ["topic", "questions"], "properties": {
    "topic": {"type": "string", "maxLength": 60},
    "questions": {"type": "array", "minItems": 1, "maxItems": 5, "items": {
        "type": "object", "additionalProperties": False, "required": ["question", "choices", "answer"],
        "properties": {"question": {"type": "string", "maxLength": 200},
                       "choices": {"type": "array", "minItems": 2, "maxItems": 4,
                                   "items": {"type": "string", "maxLength": 80}},
                       "answer": {"type": "integer", "minimum": 0, "maximum": 3}}}}}}
CALCULATOR = {"type": "object", "additionalProperties": False, "required": ["expression"], "properties": {
    "expression": {"type": "string", "pattern": "^[0-9+*/(). -]{1,60}$"}}}
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "role", "address"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                         "role": {"enum": ["student", "teacher", "parent"]},
                         "tags": {"type": "array", "items": {"type": "string"}},
                         "address": {"type": "object", "required": ["city"], "additionalProperties": False,
                                     "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}}}}
SCHEMAS = {
    "quiz": (QUIZ, {"topic": "Photosynthesis", "questions": [
        {"question": "What gas do plants take in?", "choices": ["Oxygen", "Carbon dioxide", "Nitrogen"], "answer": 1},
        {"question": "Where does photosynthesis happen?", "choices": ["Chloroplast", "Nucleus"], "answer": 0}]}),
    "calculator": (CALCULATOR, {"expression": "(12 + 30) * 4 / 2"}),
    "person": (PERSON, {"name": "Ada Lovelace", "age": 36, "role": "teacher", "tags": ["maths", "engines"],
                        "address": {"city": "London", "zip": "W1"}}),
}


def load_vocabulary(name: str):
    from typewriter.text.tokenizer import Tokenizer
    from typewriter.weights.source import embedded_model_path

    path = embedded_model_path() if name == "smollm2" else QWEN
    tokenizer = Tokenizer.load(path)
    size = tokenizer.vocab_size if name == "smollm2" else 151936  # Qwen's logits are wider than its tokenizer
    return tokenizer, size


def token_bytes(tokenizer, size: int) -> list[bytes]:
    """Each id's bytes; special and unused ids get a mark no text contains (0xff is never in UTF-8)."""
    out = []
    for i in range(size):
        b = tokenizer.token_bytes(i) if i < tokenizer.vocab_size else b""
        out.append(b if b and i not in tokenizer.special_ids else b"\xff<%d>" % i)
    return out


# ---- candidates: compile(schema) -> matcher factory; matcher: mask into row, consume token ----

class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer, size: int):
        import llguidance
        import llguidance.numpy as lln

        self.llg, self.lln, self.size = llguidance, lln, size
        pieces = token_bytes(tokenizer, size)

        class Vocab:
            eos_token_id = min(tokenizer.eos_token_ids)
            bos_token_id = None
            tokens = pieces
            special_token_ids = sorted(i for i in range(size) if pieces[i].startswith(b"\xff"))

            def __call__(self, text):
                return tokenizer.encode(text.decode() if isinstance(text, bytes) else text)

        started = time.perf_counter()
        self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocab()), n_vocab=size,
                                          eos_token=sorted(tokenizer.eos_token_ids))
        self.tokenizer_s = time.perf_counter() - started
        self.executor = llguidance.LLExecutor(num_threads=2)

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
        matcher = self.llg.LLMatcher(self.tok, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def new(self, compiled):
        return compiled.deep_copy()

    def masks(self, matchers, bitmask):
        if len(matchers) == 1:
            self.lln.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.lln.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def consume(self, matcher, token: int):
        assert matcher.consume_token(token), matcher.get_error()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer, size: int):
        import outlines_core

        self.oc = outlines_core
        started = time.perf_counter()
        pieces: dict[bytes, list[int]] = {}
        eos = min(tokenizer.eos_token_ids)
        for i, b in enumerate(token_bytes(tokenizer, size)):
            if i != eos and not b.startswith(b"\xff"):
                pieces.setdefault(b, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, pieces)
        self.tokenizer_s = time.perf_counter() - started
        self.size = size

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), r"[ ]?")
        return self.oc.Index(regex, self.vocabulary)

    def new(self, compiled):
        return self.oc.Guide(compiled)

    def masks(self, guides, bitmask):
        for i, guide in enumerate(guides):
            row = bitmask[i:i + 1]
            guide.write_mask_into(row.ctypes.data, row.size, row.itemsize)

    def consume(self, guide, token: int):
        guide.advance(token)


class Formatron:
    """formatron 0.5.0 does not import beside the pydantic this venv has (2.14: `formatron.formatter` reads
    `pydantic.typing.Type`); the script prints that as its finding. Driven directly, its engine kbnf 0.4.2 rejected
    the first token of every valid answer under the regular expressions outlines-core writes for our schemas, so
    it is not measured further (see the study)."""

    name = "formatron"

    def __init__(self, tokenizer, size: int):
        importlib.import_module("formatron.formatter")  # raises here


CANDIDATES = {"llguidance": Llguidance, "outlines-core": OutlinesCore, "formatron": Formatron}


def answer_tokens(tokenizer, document: dict, separators=(", ", ": ")) -> list[int]:
    return tokenizer.encode(json.dumps(document, separators=separators))


def measure(lib, tokenizer, size: int, schema_name: str, repeats: int, batch_sizes=(1, 16)) -> list[dict]:
    schema, document = SCHEMAS[schema_name]
    tokens = answer_tokens(tokenizer, document)
    if lib.name == "outlines-core":  # its regex allows one optional space: feed the compact text it generates
        tokens = answer_tokens(tokenizer, document, (", ", ": "))
    rows = []
    compile_s = []
    for _ in range(repeats):
        started = time.perf_counter()
        compiled = lib.compile(schema)
        compile_s.append(time.perf_counter() - started)
    rows.append({"measure": "compile_ms", "values": [round(s * 1000, 2) for s in compile_s]})
    logits = np.random.default_rng(0).standard_normal((16, size)).astype(np.float32)
    for batch in batch_sizes:
        if lib.name == "formatron" and batch > 1:
            continue  # one kbnf engine per compile: a batch of 16 would need 16 compiles (see the study)
        per_token = []
        for _ in range(repeats):
            matchers = [lib.new(compiled) for _ in range(batch)]
            bitmask = np.full((batch, (size + 31) // 32), -1, dtype=np.int32)
            spent = [0.0, 0.0, 0.0]  # mask, apply, consume
            for token in tokens:
                t0 = time.perf_counter()
                lib.masks(matchers, bitmask)
                t1 = time.perf_counter()
                _apply(logits[:batch], bitmask)
                t2 = time.perf_counter()
                for m in matchers:
                    lib.consume(m, token)
                t3 = time.perf_counter()
                for k, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
                    spent[k] += dt
            per_token.append([s / len(tokens) for s in spent])
        for k, what in enumerate(("mask", "apply", "consume")):
            rows.append({"measure": f"{what}_ms_per_step_batch_{batch}",
                         "values": [round(s[k] * 1000, 4) for s in per_token], "tokens": len(tokens)})
    return rows


def _apply(logits: np.ndarray, bitmask: np.ndarray) -> None:
    """The engine's own way to apply a bitmask [rows, words] to logits [rows, vocab]: unpack to bools."""
    allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, : logits.shape[1]]
    np.copyto(logits, -np.inf, where=allowed == 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--libraries", default=",".join(CANDIDATES))
    parser.add_argument("--vocabularies", default="smollm2,qwen")
    parser.add_argument("--schemas", default=",".join(SCHEMAS))
    args = parser.parse_args()
    for vocab in args.vocabularies.split(","):
        tokenizer, size = load_vocabulary(vocab)
        for name in args.libraries.split(","):
            try:
                lib = CANDIDATES[name](tokenizer, size)
            except Exception as e:  # a candidate that cannot even load is a finding, not a crash
                print(json.dumps({"library": name, "vocabulary": vocab, "error": f"{type(e).__name__}: {e}"}))
                continue
            print(json.dumps({"library": name, "vocabulary": vocab, "size": size, "measure": "tokenizer_ms",
                              "values": [round(lib.tokenizer_s * 1000, 1)]}), flush=True)
            for schema in args.schemas.split(","):
                try:
                    for row in measure(lib, tokenizer, size, schema, args.repeats):
                        med = statistics.median(row["values"])
                        print(json.dumps({"library": name, "vocabulary": vocab, "schema": schema, **row,
                                          "median": med}), flush=True)
                except Exception as e:
                    print(json.dumps({"library": name, "vocabulary": vocab, "schema": schema,
                                      "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
    print(json.dumps({"python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
