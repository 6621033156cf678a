"""One stable model id (Settings.model.id, config.default_model_id): the same in /v1/models, OpenAI responses,
/readyz, the page's settings and the log, whatever name the model file carries inside."""

from __future__ import annotations

import json
import logging
import re

import httpx
import pytest
from live_server import running
from scripted import factory, script_engine

from typewriter.config import ConfigError, Settings, default_model_id


@pytest.mark.parametrize(("model_path", "model_id"), [
    (None, "SmolLM2-135M-Instruct"),  # the embedded model, whatever its GGUF's general.name says
    ("", "SmolLM2-135M-Instruct"),
    ("/models/SmolLM2-360M-Instruct.Q8_0.gguf", "SmolLM2-360M-Instruct.Q8_0"),
    ("~/models/Qwen2.5 0.5B  Instruct.GGUF", "Qwen2.5-0.5B-Instruct"),  # spaces become one "-", .gguf goes
    ("/models/Qwen2.5-0.5B-Instruct/", "Qwen2.5-0.5B-Instruct"),  # a folder: its whole name, dots kept
    ("exported", "exported"),
])
def test_the_default_id_is_the_embedded_models_name_or_the_file_or_folder_name_without_spaces(model_path, model_id):
    assert default_model_id(model_path) == model_id
    assert Settings.of(model_path=model_path).model.id == model_id


def test_an_id_can_be_set_and_one_with_spaces_is_a_named_error():
    assert Settings.from_env({"TYPEWRITER_MODEL_ID": "tutor-v2"}, model_path="/m/x.gguf").model.id == "tutor-v2"
    assert Settings.from_env({}, model_id="tutor-v3").model.id == "tutor-v3"
    for bad in ("", "my tutor", "tab\there", "x" * 129):
        with pytest.raises(ConfigError, match="TYPEWRITER_MODEL_ID: must be 1 to 128 characters without spaces"):
            Settings.of(model_id=bad)


def test_the_id_is_the_same_in_models_responses_readyz_the_page_and_the_log(caplog):
    caplog.set_level(logging.INFO, logger="typewriter.server")
    question = {"messages": [{"role": "user", "content": "hi"}]}
    with running(factory(script_engine()), model_path="/models/My Tutor v2.gguf") as (_, address):
        base = f"http://{address}"
        listed = httpx.get(f"{base}/v1/models").json()["data"]
        whole = httpx.post(f"{base}/v1/chat/completions", json=question | {"model": "gpt-4o"}).json()
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=question | {"stream": True}) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: {")]
        ready = httpx.get(f"{base}/readyz").json()
        page = httpx.get(f"{base}/").text
    settings = json.loads(re.search(r'<script type="application/json" id="settings">(.*?)</script>', page).group(1))
    assert [m["id"] for m in listed] == ["My-Tutor-v2"]
    assert whole["model"] == "My-Tutor-v2"  # any model a request names is accepted; the answer names ours
    assert {c["model"] for c in chunks} == {"My-Tutor-v2"}
    assert ready["model"] == "My-Tutor-v2"
    assert settings["model"] == "My-Tutor-v2"
    assert "ready: My-Tutor-v2, 2 slots" in caplog.text
