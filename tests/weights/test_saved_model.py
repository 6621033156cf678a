"""`typewriter export` and `--model DIR` on the tiny model: the SavedModel holds the same weights and tokenizer,
its own signatures generate what the in-memory model generates, a process that never reads the GGUF file
answers token for token as one that does, and every unusable DIR is a named error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from real_server import real_server
from repo import ROOT
from tiny_model import random_weights, tiny_config, write_gguf
from websockets.sync.client import connect

from typewriter.assemble import export
from typewriter.errors import ExportError, ModelFormatError
from typewriter.text.tokenizer import Tokenizer
from typewriter.weights import load_weights
from typewriter.weights.saved_model import EXTRA, MANIFEST

CONTEXT = 128
MESSAGES = [[{"role": "user", "content": "hello world"}],
            [{"role": "user", "content": "héllo wörld ✓ 😀"}, {"role": "assistant", "content": "hi"},
             {"role": "user", "content": "<|im_end|> again"}]]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    cfg = tiny_config(tie_embeddings=False)
    return write_gguf(tmp_path_factory.mktemp("source") / "tiny.gguf", cfg, random_weights(cfg))


@pytest.fixture(scope="module")
def exported(gguf, tmp_path_factory) -> Path:
    return export(gguf, tmp_path_factory.mktemp("export") / "tiny-savedmodel", CONTEXT)


def test_the_savedmodel_holds_exactly_the_weights_and_config_of_its_source(gguf, exported):
    cfg, weights = load_weights(gguf)
    cfg_back, weights_back = load_weights(exported)
    assert cfg_back == cfg
    assert sorted(weights_back) == sorted(weights)
    for name, array in weights.items():
        np.testing.assert_array_equal(weights_back[name], array, err_msg=name)


def test_a_tied_model_round_trips_too(tmp_path):
    cfg = tiny_config(tie_embeddings=True)
    weights = random_weights(cfg, seed=3)
    source = write_gguf(tmp_path / "tied.gguf", cfg, weights)
    cfg_back, weights_back = load_weights(export(source, tmp_path / "out", 64))
    assert cfg_back.tie_embeddings and "output" not in weights_back
    np.testing.assert_array_equal(weights_back["tok_embeddings"], load_weights(source)[1]["tok_embeddings"])


def test_the_tokenizer_and_chat_template_encode_as_the_sources_do(gguf, exported):
    source, back = Tokenizer.load(gguf), Tokenizer.load(exported)
    for messages in MESSAGES:
        assert back.encode_chat(messages, "Be brief.") == source.encode_chat(messages, "Be brief.")
    assert back.eos_token_ids == source.eos_token_ids and back.name == source.name
    assert [back.token_bytes(i) for i in range(back.vocab_size)] == \
        [source.token_bytes(i) for i in range(source.vocab_size)]


def test_the_signatures_alone_generate_what_the_in_memory_model_does(gguf, exported):
    import tensorflow as tf

    from typewriter.runners.xla.model import Transformer

    cfg, weights = load_weights(gguf)
    model = Transformer(cfg, weights, slots=1, max_len=CONTEXT, max_chunk=64)
    loaded = tf.saved_model.load(str(exported))
    prefill, decode_step = loaded.signatures["prefill"], loaded.signatures["decode_step"]
    prompt = Tokenizer.load(gguf).encode_chat(MESSAGES[1], "Be brief.")
    assert len(prompt) > 64, "the prompt should take two prefill calls"

    def greedy(prefill_chunk, step) -> list[int]:
        for start in range(0, len(prompt), 64):
            piece = prompt[start:start + 64]
            tokens = np.zeros([1, 64], np.int32)
            tokens[0, :len(piece)] = piece
            logits = prefill_chunk(tf.constant(tokens), tf.constant(start), tf.constant(len(piece)))
        out = [int(np.argmax(logits[0]))]
        for position in range(len(prompt), len(prompt) + 12):
            out.append(int(np.argmax(step(tf.constant([out[-1]], tf.int32), tf.constant(position))[0])))
        return out

    theirs = greedy(lambda t, s, n: prefill(tokens=t, start=s, length=n)["logits"].numpy(),
                    lambda t, p: decode_step(token=t, position=p)["logits"].numpy())
    ours = greedy(lambda t, s, n: model.extend(t, s, n, tf.constant(0), CONTEXT).numpy(),
                  lambda t, p: model.decode(t, p[None], tf.constant([0]), CONTEXT).numpy())
    assert theirs == ours


@pytest.mark.slow
@pytest.mark.e2e
def test_a_process_that_never_reads_the_gguf_file_answers_token_for_token_the_same(gguf, tmp_path):
    source = tmp_path / "only-copy.gguf"
    shutil.copy(gguf, source)
    args = ["--json", "--temperature", "0", "--max-new-tokens", "16", "--max-context", str(CONTEXT), "--system",
            "Be brief.", "hello world"]
    before = _generate("--model", str(source), *args)
    saved = export(source, tmp_path / "saved", CONTEXT)
    source.unlink()  # nothing may read it from here on
    after = _generate("--model", str(saved), *args)
    assert after == before and len(before) > 1

    with real_server({"TYPEWRITER_MODEL_PATH": str(saved), "TYPEWRITER_MAX_CONTEXT": str(CONTEXT),
                      "TYPEWRITER_SYSTEM_PROMPT": "Be brief."}, tmp_path / "server.log") as base:
        with connect(base.replace("http", "ws") + "/ws") as ws:
            ws.send(json.dumps({"type": "chat", "id": "s1", "messages": [{"role": "user", "content": "hello"}],
                                "params": {"max_new_tokens": 8, "temperature": 0}}))
            frames = [json.loads(ws.recv(timeout=60))]
            while frames[-1]["type"] not in ("end", "error"):
                frames.append(json.loads(ws.recv(timeout=60)))
    assert frames[-1]["type"] == "end", frames[-1]


def _generate(*args: str) -> list[int]:
    run = subprocess.run([sys.executable, "-m", "typewriter", "generate", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return [line["token_id"] for line in map(json.loads, run.stdout.splitlines()) if line["type"] == "token"]


# ---- bad input ----


def _copy(exported: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(exported, tmp_path / "copy"))


def test_a_savedmodel_of_another_format_version_is_refused_saying_to_export_again(exported, tmp_path):
    copy = _copy(exported, tmp_path)
    manifest = copy / EXTRA / MANIFEST
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | {"version": 99}))
    with pytest.raises(ModelFormatError, match="version 99, and this typewriter reads version 1; export it again"):
        load_weights(copy)


def test_a_savedmodel_not_written_by_export_is_refused(exported, tmp_path):
    copy = _copy(exported, tmp_path)
    shutil.rmtree(copy / EXTRA)
    with pytest.raises(ModelFormatError, match="not one written by `typewriter export`"):
        load_weights(copy)


def test_damaged_variables_are_a_named_error(exported, tmp_path):
    copy = _copy(exported, tmp_path)
    for data in (copy / "variables").glob("variables.data-*"):
        data.write_bytes(b"\0" * 16)
    with pytest.raises(ModelFormatError, match="export the model again"):
        load_weights(copy)


def test_a_missing_dir_and_a_dir_of_nothing_are_named_errors(tmp_path):
    with pytest.raises(ModelFormatError, match="no such model file or directory"):
        load_weights(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFormatError, match="no config.json"):
        load_weights(tmp_path / "empty")


def test_export_refuses_a_folder_that_is_not_empty_and_leaves_it_alone(gguf, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not an empty folder"):
        export(gguf, tmp_path, CONTEXT)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
