"""A model whose chat template has no tool format refuses tools by the model's id (as /v1/models names it),
not by the tokenizer's label, which is a training run's name and means nothing to the caller."""

from __future__ import annotations

from helpers import serving

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def test_a_tool_refusal_names_the_model_id_of_v1_models_not_the_tokenizer():
    with serving(model_id="tutor-model") as (client, engine):
        models = client.get("/v1/models").json()
        response = client.post("/v1/chat/completions", json={
            "model": "tutor-model", "messages": [{"role": "user", "content": "add 2 and 3"}], "tools": TOOLS})
    assert [m["id"] for m in models["data"]] == ["tutor-model"]
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "not_supported" and error["param"] == "tools"
    assert error["message"].startswith("tools: tutor-model's chat template has no tool format"), error["message"]
    assert engine.tokenizer.name not in error["message"]
    assert engine.submitted == []
