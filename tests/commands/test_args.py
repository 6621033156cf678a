"""The options every model command shares (commands/args.py): a value that can be refused without the model is
refused before it loads, as `serve` refuses it, and --weights' help says which format is the fast one."""

from __future__ import annotations

import subprocess
import sys
import time
import types

import pytest

from typewriter import cli

REFUSED_AT_ONCE_S = 5.0  # a Python start and the parser; loading the model takes longer even from the cache


@pytest.fixture
def no_loading(monkeypatch):
    """typewriter.assemble replaced by a module whose every door fails the test: nothing may load."""
    fake = types.ModuleType("typewriter.assemble")

    def loaded(*args, **kwargs):
        pytest.fail("the command loaded the model")

    fake.load = fake.export = loaded
    monkeypatch.setitem(sys.modules, "typewriter.assemble", fake)


REFUSALS = [
    (["generate", "--max-context", "8", "hi"], "--max-context: must be at least 16, got 8"),
    (["chat", "--max-context", "8"], "--max-context: must be at least 16, got 8"),
    (["bench", "--max-context", "8"], "--max-context: must be at least 16, got 8"),
    (["export", "--max-context", "8", "--out", "{tmp}/out"], "--max-context: must be at least 16, got 8"),
    (["generate", "--max-new-tokens", "64", "--max-context", "64", "hi"],
     "invalid_request: max_new_tokens: must be smaller than the context (64 tokens, --max-context)"),
    (["chat", "--max-new-tokens", "5000"],
     "invalid_request: max_new_tokens: must be smaller than the context (2048 tokens, --max-context)"),
    (["bench", "--tokens", "256", "--max-context", "128"], "--tokens: must be smaller than --max-context (128)"),
    (["export", "--out", "{tmp}/full"], "export: {tmp}/full: already exists and is not an empty folder"),
    (["serve", "--model", "{tmp}/missing.gguf"], "model_format: {tmp}/missing.gguf: no such model file"),
]


def _argv(argv: list[str], tmp_path) -> list[str]:
    (tmp_path / "full").mkdir(exist_ok=True)
    (tmp_path / "full" / "saved_model.pb").write_bytes(b"")
    return [a.format(tmp=tmp_path) for a in argv]


@pytest.mark.parametrize("argv, said", REFUSALS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_value_refused_without_the_model_exits_2_before_it_loads(argv, said, tmp_path, no_loading, capsys):
    try:
        code = cli.main(_argv(argv, tmp_path))
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"typewriter: error: {said.format(tmp=tmp_path)}"), err


@pytest.mark.parametrize("argv, said", [REFUSALS[0], REFUSALS[3], REFUSALS[-1]], ids=["generate", "export", "serve"])
def test_the_command_says_one_line_at_once_and_prints_no_loading_progress(argv, said, tmp_path):
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "typewriter", *_argv(argv, tmp_path)], capture_output=True,
                         text=True, timeout=60, stdin=subprocess.DEVNULL)
    took = time.monotonic() - started
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [run.stderr.strip()], run.stderr  # one line: no progress before it
    assert run.stderr.startswith(f"typewriter: error: {said.format(tmp=tmp_path)}")
    assert "loading" not in run.stderr and run.stdout == ""
    assert took < REFUSED_AT_ONCE_S, f"refused after {took:.1f} s"


def test_the_weights_help_names_int8_lite_as_the_fast_one_and_xlas_int8_as_slower_for_one_row(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "auto is q4-blocks on AVX-512 VNNI, else int8-lite for Llama models, else fp32" in help_text
    assert "XLA's int8 4x fewer bytes than fp32 but slower for one row" in help_text
    assert "int8 is faster" not in help_text
