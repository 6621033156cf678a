"""A chat that fails for an unexpected reason before it reaches the engine (here the chat template raises, as
Mistral's does for roles that do not alternate) is refused as `internal`, and the socket goes on serving. Found
while typing server/chats.py (mypy's possibly-undefined): the handler logged a loop variable bound only once
submitting began, so such a failure raised UnboundLocalError instead of a refusal."""

from __future__ import annotations

import logging

from helpers import chat, receive, serving, text_of, until_terminal
from scripted import script_engine


def test_a_chat_the_template_cannot_render_is_refused_as_internal_and_the_socket_serves_the_next(caplog):
    engine = script_engine()
    encode_chat = engine.tokenizer.encode_chat

    def template(messages, system=None, tools=None):
        if messages[-1]["content"] == "twice":
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")
        return encode_chat(messages, system, tools)

    engine.tokenizer.encode_chat = template
    with caplog.at_level(logging.ERROR, logger="typewriter.server"), serving(engine) as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat("bad", "twice"))
            refused = receive(ws)
            ws.send_json(chat("good", "once"))
            frames = until_terminal(lambda: receive(ws))
    assert refused == {"type": "error", "id": "bad", "code": "internal",
                       "message": "the server could not start this chat; see the server log"}
    assert "chat r1 could not be submitted" in caplog.text
    assert text_of(frames) == "Hello, world!"
