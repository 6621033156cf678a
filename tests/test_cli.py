"""The `typewriter` command end to end on the real embedded model, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import default_weights
from repo import ROOT

from typewriter.weights.source import embedded_model_path

pytestmark = pytest.mark.slow

SMALL = ["--max-context", "256"]  # fewer buckets to compile
MADE = {"q4-blocks": "q4-blocks: layer 30/30 packed", "int8-lite": "int8-lite: program 32/32"}
KEPT = {"q4-blocks": "q4-blocks: blocks from", "int8-lite": "int8-lite: programs from"}


def typewriter(*args: str, stdin: str | None = None, timeout: float = 600,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "typewriter", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=os.environ | (env or {}))


def test_generate_json_streams_tokens_whose_texts_concatenate_to_the_answer(tmp_path):
    cache = {"TYPEWRITER_LITE_CACHE": str(tmp_path / "lite")}
    run = typewriter("generate", "--json", "--temperature", "0", "--raw", "--max-new-tokens", "12", *SMALL,
                     "The capital of France is", env=cache)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    tokens, end = lines[:-1], lines[-1]
    assert [t["type"] for t in tokens] == ["token"] * len(tokens)
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    answer = "".join(t["text"] for t in tokens)
    assert answer.startswith(" Paris.")
    assert end["type"] == "end" and end["reason"] == "length"
    assert end["usage"] == {"prompt_tokens": 5, "completion_tokens": 12}
    assert end["timings"]["ttft_ms"] > 0 and end["timings"]["tokens_per_s"] > 0 and end["timings"]["load_ms"] > 0
    default = default_weights(embedded_model_path())  # what `auto` runs it as here
    assert "loaded" in run.stderr and MADE[default] in run.stderr  # progress while making them
    again = typewriter("generate", "--json", "--temperature", "0", "--raw", "--max-new-tokens", "12", *SMALL,
                       "The capital of France is", env=cache)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{KEPT[default]} {tmp_path / 'lite'}" in again.stderr and "weights" not in again.stderr
    assert again.stdout.splitlines()[:-1] == run.stdout.splitlines()[:-1]  # the same tokens from the cached ones


def test_generate_stops_at_a_stop_sequence_without_printing_it():
    def answer(*extra: str) -> tuple[str, str]:
        run = typewriter("generate", "--json", "--temperature", "0", "--repetition-penalty", "1", "--raw",
                         "--max-new-tokens", "12", *extra, *SMALL, "The capital of France is")
        assert run.returncode == 0, run.stderr[-2000:]
        lines = [json.loads(line) for line in run.stdout.splitlines()]
        return "".join(t["text"] for t in lines[:-1]), lines[-1]["reason"]

    full, reason = answer()
    assert reason == "length" and full.startswith(" Paris.")
    stop = full.split()[2]  # the third word of the greedy answer, whatever the weights make it
    cut, reason = answer("--stop", stop)
    assert reason == "stop_sequence"
    assert cut == full[:full.index(stop)]  # everything before it, and not the stop sequence itself


def test_generate_rejects_a_bad_sampling_value_with_a_named_error():
    run = typewriter("generate", "--top-p", "1.5", "hi")
    assert run.returncode == 2
    assert "top_p" in run.stderr and "Traceback" not in run.stderr


def test_chat_answers_each_turn_and_leaves_on_end_of_input():
    run = typewriter("chat", "--temperature", "0", "--max-new-tokens", "16", *SMALL,
                     stdin="What is 2 + 2?\nAnd 3 + 3?\n")
    assert run.returncode == 0, run.stderr[-2000:]
    answers = [line for line in run.stdout.splitlines() if line.startswith("you> tutor> ") or "tutor> " in line]
    assert len(answers) == 2 and all(len(a.split("tutor> ", 1)[1].strip()) > 0 for a in answers)


def test_bench_reports_every_measure_as_json():
    run = typewriter("bench", "--json", "--tokens", "16", "--streams", "2", *SMALL)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    for key in ("load_s", "ttft_uncached_ms", "ttft_ms", "single_tokens_per_s", "aggregate_tokens_per_s",
                "batched_vs_single"):
        assert result[key] > 0, key
    assert result["compile_s"] == 0  # the default, q4-blocks or int8-lite, compiles nothing
    assert result["ttft_ms"] < result["ttft_uncached_ms"]  # the second measure reuses all but the last token
