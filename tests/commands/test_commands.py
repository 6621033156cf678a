"""The `typewriter` parser and dispatch, without a model: help, defaults from their one source, named errors for
bad values before anything loads, and generate, chat and bench on the real Engine over a scripted runner."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import types

import pytest
from scripted import script_engine

from typewriter import cli
from typewriter.commands.args import sampling_params
from typewriter.commands.serve import settings_from_args
from typewriter.config import DEFAULT_MAX_NEW_TOKENS, Settings, lite_cache_dir
from typewriter.engine.request import SMALL_MODEL_PARAMETERS, SamplingParams
from typewriter.errors import PromptTooLong


def parse(*argv: str):
    return cli.build_parser().parse_args(argv)


def typewriter(capsys, *argv: str) -> tuple[int, str, str]:
    """What `typewriter ARGV` returns or exits with, its stdout and its stderr."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def loads(monkeypatch):
    """Replaces typewriter.assemble (and with it TensorFlow) by a fake whose `load` records its arguments in
    `.calls` and returns `.engine` and its tokenizer; with no `.engine` set, loading fails the test."""
    fake = types.ModuleType("typewriter.assemble")
    fake.calls, fake.engine = [], None

    def load(model_path, **kwargs):
        assert fake.engine is not None, "the command loaded the model"
        fake.calls.append({"model_path": model_path, **kwargs})
        return fake.engine, fake.engine.tokenizer, types.SimpleNamespace(load_s=1.5, compile_s=2.5)

    fake.load = load
    monkeypatch.setitem(sys.modules, "typewriter.assemble", fake)
    yield fake
    if fake.engine is not None:
        fake.engine.shutdown()


# ---- the parser ----


@pytest.mark.parametrize("command", [[], *([name] for name in cli.COMMANDS)])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main([*command, "--help"])
    assert exit.value.code == 0
    assert "usage: typewriter" in capsys.readouterr().out


def test_help_and_the_parser_import_neither_tensorflow_nor_the_server():
    code = ("import sys\nfrom typewriter import cli\ncli.build_parser().format_help()\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'numpy', 'uvicorn', 'starlette'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_sampling_defaults_are_those_of_sampling_params(command):
    args = parse(command, "hi") if command == "generate" else parse(command)
    assert sampling_params(args) == SamplingParams()
    assert args.system is None  # the tokenizer chooses the default system prompt


def test_help_shows_the_defaults_from_sampling_params_and_settings(capsys):
    def help_text(command: str) -> str:
        _, out, _ = typewriter(capsys, command, "--help")
        return " ".join(out.split())

    d, s = SamplingParams(), Settings()
    generate = help_text("generate")
    for shown in (f"(default {d.temperature})", f"(default {d.top_p})", f"(default {d.top_k})",
                  f"(default: the model's, {d.repetition_penalty} under {SMALL_MODEL_PARAMETERS / 1e9:.1f}B weights, "
                  "else 1)", f"(default {DEFAULT_MAX_NEW_TOKENS},",
                  f"(default {s.engine.max_context})"):
        assert shown in generate
    serve = help_text("serve")
    for shown in ("measured at start; TYPEWRITER_MAX_ACTIVE)", f"(default {s.engine.max_queue}; TYPEWRITER_MAX_QUEUE)",
                  f"(default {s.engine.max_context}; TYPEWRITER_MAX_CONTEXT)", f"(default {s.serving.port}; TYPEWRITER_PORT)"):
        assert shown in serve
    assert parse("bench").max_context == s.engine.max_context


def test_given_sampling_options_reach_sampling_params():
    args = parse("generate", "--temperature", "0", "--top-k", "5", "--seed", "7", "--stop", "a", "--stop", "b",
                 "--timeout", "3", "--max-new-tokens", "20", "hi")
    assert sampling_params(args) == SamplingParams(max_new_tokens=20, temperature=0.0, top_k=5, seed=7,
                                                   stop=("a", "b"), timeout_s=3.0)


def test_an_answer_length_not_asked_for_shrinks_to_the_room_left_but_not_below_64_tokens():
    args = parse("chat")
    assert sampling_params(args, 100, 2048).max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert sampling_params(args, 1948, 2048).max_new_tokens == 100
    with pytest.raises(PromptTooLong):
        sampling_params(args, 2000, 2048)
    asked = parse("chat", "--max-new-tokens", "300")
    assert sampling_params(asked, 1948, 2048).max_new_tokens == 300  # kept; the engine refuses what cannot fit


@pytest.mark.parametrize("argv, named", [
    (["generate", "--top-p", "1.5", "hi"], "invalid_request: top_p:"),
    (["generate", "--max-new-tokens", "0", "hi"], "invalid_request: max_new_tokens:"),
    (["chat", "--temperature", "-1"], "invalid_request: temperature:"),
    (["chat", "--stop", ""], "invalid_request: stop:"),
])
def test_a_bad_sampling_value_exits_2_with_a_named_error_before_the_model_loads(argv, named, loads, capsys):
    code, _, err = typewriter(capsys, *argv)
    assert code == 2 and err.startswith(f"typewriter: error: {named}")
    assert loads.calls == []


@pytest.mark.parametrize("argv, message", [
    (["bench", "--streams", "0"], "argument --streams: must be at least 1, got 0"),
    (["bench", "--tokens", "-3"], "argument --tokens: must be at least 1, got -3"),
    (["loadtest", "--url", "ws://h/ws", "--concurrency", "0"], "argument --concurrency: must be at least 1"),
    (["loadtest", "--url", "ws://h/ws", "--requests", "0"], "argument --requests: must be at least 1"),
    (["loadtest", "--url", "ws://h/ws", "--max-new-tokens", "x"], "argument --max-new-tokens: must be an integer"),
    (["loadtest", "--url", "h:8000/ws"], "argument --url: must be a ws:// URL such as"),
    (["loadtest"], "the following arguments are required: --url"),
])
def test_bench_and_loadtest_refuse_counts_below_one_and_a_url_that_is_not_a_websocket(argv, message, loads,
                                                                                        capsys):
    code, _, err = typewriter(capsys, *argv)
    assert code == 2 and message in err
    assert loads.calls == []


def test_serve_reads_its_options_into_settings_and_refuses_a_bad_one_by_name(monkeypatch, capsys):
    monkeypatch.setenv("TYPEWRITER_MAX_ACTIVE", "3")
    settings = settings_from_args(parse("serve", "--model", "m.gguf", "--max-queue", "5"))
    assert (settings.model.model_path, settings.engine.max_queue, settings.engine.max_active) == ("m.gguf", 5, 3)
    assert settings.engine.max_context == Settings().engine.max_context
    assert settings.model.weights == Settings().model.weights
    monkeypatch.setenv("TYPEWRITER_WEIGHTS", "int8")
    assert settings_from_args(parse("serve")).model.weights == "int8"
    assert settings_from_args(parse("serve", "--weights", "fp32")).model.weights == "fp32"  # the flag wins
    code, _, err = typewriter(capsys, "serve", "--port", "70000")
    assert code == 2 and err.startswith("typewriter: error: --port: must be a port from 0 to 65535")


def test_serve_refuses_a_bad_classes_file_by_its_line_before_anything_loads(tmp_path, capsys, loads):
    classes = tmp_path / "classes.toml"
    classes.write_text('[[class]]\nname = "Algebra 1"\njoin = "ALG1-7QX2"\nweight = -1\n')
    code, _, err = typewriter(capsys, "serve", "--classes", str(classes))
    assert code == 2 and err.startswith(f"typewriter: error: {classes}:4: class 'Algebra 1': weight: must be")
    assert loads.calls == []


# ---- the commands over the fake engine ----


def test_generate_json_streams_tokens_then_the_end_on_a_single_slot_that_never_queues(loads, capsys):
    loads.engine = script_engine(slots=1, max_queue=0)
    code, out, _ = typewriter(capsys, "generate", "--json", "--model", "m.gguf", "why?")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    (call,) = loads.calls
    assert call | {"progress": None} == {"model_path": "m.gguf", "slots": 1, "max_context": Settings().engine.max_context,
                                         "max_queue": 0, "prefill_budget": Settings().engine.prefill_budget, "progress": None,
                                         "compile": "lazy", "weight_format": Settings().model.weights,
                                         "program_cache": lite_cache_dir(),
                                         "draft_tokens": Settings().engine.draft_tokens}
    # the CLI compiles only what its request needs
    assert [t["text"] for t in lines[:-1]] == ["Hello", ",", " world", "!", ""]  # the eos token has no text
    assert [t["index"] for t in lines[:-1]] == [0, 1, 2, 3, 4]
    assert lines[-1]["type"] == "end" and lines[-1]["reason"] == "eos"
    assert lines[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 5}
    assert loads.engine.tokenizer.calls == [([{"role": "user", "content": "why?"}], None)]


def test_generate_passes_an_empty_system_prompt_through(loads, capsys):
    loads.engine = script_engine(slots=1, max_queue=0)
    assert typewriter(capsys, "generate", "--system", "", "why?")[0] == 0
    assert loads.engine.tokenizer.calls[0][1] == ""


def test_generate_names_a_prompt_that_leaves_under_64_tokens_of_room_and_exits_2(loads, capsys):
    loads.engine = script_engine(slots=1, max_queue=0, max_context=70)
    code, _, err = typewriter(capsys, "generate", " ".join(["word"] * 10))
    assert code == 2 and err.startswith("typewriter: error: prompt_too_long: the prompt is 11 tokens")
    assert loads.engine.submitted == []


def test_chat_leaves_out_old_turns_drops_a_question_too_long_alone_and_goes_on(loads, capsys, monkeypatch):
    loads.engine = script_engine(slots=1, max_queue=0, max_context=100)
    long_question = " ".join(["word"] * 60)
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"two plus two\n{long_question}\nthree plus three\n"))
    code, _, err = typewriter(capsys, "chat")
    assert code == 0
    assert err.count("[prompt_too_long: ") == 1
    asked = [messages for messages, _ in loads.engine.tokenizer.calls]
    assert asked[1:-1] == [asked[1], [asked[1][-1]]]  # the long question with the history, then alone
    assert asked[-1] == [{"role": "user", "content": "two plus two"},
                        {"role": "assistant", "content": "Hello, world!"},
                        {"role": "user", "content": "three plus three"}]
    assert len(loads.engine.submitted) == 2


def test_bench_runs_its_streams_on_as_many_slots_with_no_queue(loads, capsys):
    loads.engine = script_engine(["t"] * 8, slots=2, max_queue=0)
    code, out, _ = typewriter(capsys, "bench", "--json", "--tokens", "8", "--streams", "2")
    assert code == 0
    assert (loads.calls[0]["slots"], loads.calls[0]["max_queue"]) == (2, 0)
    result = json.loads(out)
    assert (result["load_s"], result["compile_s"], result["streams"]) == (1.5, 2.5, 2)
    assert result["aggregate_tokens_per_s"] > 0 and result["batched_vs_single"] > 0
    assert loads.engine.tokenizer.calls[0][1] is None  # the tokenizer's default system prompt


class InterruptedOnce(io.StringIO):
    """A stdout where Ctrl-C arrives while the first "Stop" token is being written."""

    interrupted = False

    def write(self, text: str) -> int:
        if text == "Stop" and not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return super().write(text)


def test_chat_ctrl_c_stops_an_answer_and_the_next_question_finds_the_one_slot_free(loads, capsys, monkeypatch):
    loads.engine = script_engine(["Stop", *["ping"] * 50], slots=1, max_queue=0)
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nsecond\n"))
    monkeypatch.setattr(sys, "stdout", stdout := InterruptedOnce())
    code, _, err = typewriter(capsys, "chat", "--max-new-tokens", "3")
    assert code == 0 and "overloaded" not in err, err
    answers = stdout.getvalue().split("tutor> ")[1:]
    assert answers[0].startswith("\n[stopped]") and answers[1].startswith("Stopping")
    assert loads.engine.tokenizer.calls[1][0][1] == {"role": "assistant", "content": "Stop"}  # what was shown


def test_models_lists_every_family_that_loads(capsys):
    from typewriter.architecture.families import supported

    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    for family, _gguf, hf in supported():
        assert family in out and hf.split(",")[0] in out
    assert "SentencePiece" in out and "typewriter export" in out


def test_generate_passes_the_weight_format_it_was_given_and_refuses_an_unknown_one(loads, capsys):
    loads.engine = script_engine(slots=1, max_queue=0)
    code, _, _ = typewriter(capsys, "generate", "--weights", "int8", "--model", "m.gguf", "why?")
    assert code == 0
    assert loads.calls[0]["weight_format"] == "int8"
    code, _, err = typewriter(capsys, "generate", "--weights", "q4", "why?")
    assert code == 2
    assert "invalid choice: 'q4'" in err
