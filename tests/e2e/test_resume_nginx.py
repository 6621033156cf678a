"""Resume through Debian's nginx with deploy/nginx/typewriter.conf (only its addresses, and for one test its read
timeout, changed) in front of two replicas: in-process servers on the scripted engine for what needs exact
timing, `typewriter serve` with the real model and Chromium for a replica killed mid-answer.

- SSE keep-alives carry a stream that waits in the queue past nginx's `proxy_read_timeout 5s`; without them nginx
  cuts it (the control).
- A kept stream (X-Conversation-Id) and its `GET /v1/stream/<id>` reach the same replica: nginx hashes the
  conversation.
- The page's replica gets SIGKILL while it writes an answer: the page finishes the answer from the other one,
  greedy-equal to an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import uuid
from contextlib import ExitStack

import httpx
import pytest
from helpers import wait_until
from real_server import server_process
from resume_page import (
    ANSWER_TIMEOUT_MS,
    answer_text,
    ask,
    browser_page,
    finished,
    greedy_answer,
    new_chat,
    sent_frames,
    tokens_received,
)
from scripted import script_engine
from served import running
from services import free_port, local_conf, metric, nginx

pytestmark = [pytest.mark.services]

PIECES = [f"w{i} " for i in range(40)]
BODY = {"model": "scripted-model", "messages": [{"role": "user", "content": "go on"}], "stream": True,
        "max_tokens": 60}
REPLICA = dict(trusted_proxies="127.0.0.1", allowed_hosts="127.0.0.1,localhost")


def sse_body(front: str, headers: dict | None = None) -> tuple[bytes, bool]:
    """One streamed completion through nginx: (the bytes, whether it ended with [DONE])."""
    body = b""
    try:
        with httpx.stream("POST", f"{front}/v1/chat/completions", json=BODY, headers=headers or {},
                          timeout=60) as response:
            assert response.status_code == 200, response.read()
            for part in response.iter_raw():
                body += part
    except httpx.RemoteProtocolError:  # nginx closed the stream mid-answer (its upstream timed out)
        pass
    return body, body.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("keepalive_s", [1.0, None], ids=["keep-alive", "without"])
def test_a_stream_waiting_in_the_queue_outlasts_nginx_s_5s_read_timeout_only_with_keep_alives(tmp_path, keepalive_s):
    # one slot; the first answer holds it for 8 s, so the second waits past nginx's 5 s in the queue
    engine = script_engine(PIECES * 4, step_s=0.05, slots=1, max_context=512)
    with ExitStack() as stack:
        _, address = stack.enter_context(running(engine, sse_keepalive_s=keepalive_s, max_context=512,
                                                 max_new_tokens_cap=200, **REPLICA))
        front = stack.enter_context(nginx(local_conf(free_port(), [address], read_timeout_s=5), tmp_path / "nginx"))
        with httpx.stream("POST", f"{front}/v1/chat/completions", json=BODY | {"max_tokens": 160}, timeout=60) as first:
            assert first.status_code == 200
            wait_until(lambda: engine.stats().active == 1, "the first answer holds the slot")
            second, done = sse_body(front)
            first.read()
    if keepalive_s is not None:
        assert done and b": keep-alive" in second and b": queued 1" in second
    else:
        assert not done, "without keep-alives nginx should have cut the waiting stream"
        assert b"upstream timed out" in (tmp_path / "nginx" / "error.log").read_bytes()


def test_a_kept_stream_is_read_again_through_nginx_from_the_replica_that_has_it(tmp_path):
    with ExitStack() as stack:
        replicas = [stack.enter_context(running(script_engine(PIECES, step_s=0.03), **REPLICA))[1]
                    for _ in range(2)]
        front = stack.enter_context(nginx(local_conf(free_port(), replicas), tmp_path / "nginx"))
        for _ in range(4):  # four conversations: with two replicas, a stream found by luck would show
            conversation = str(uuid.uuid4())
            before = b""
            with httpx.stream("POST", f"{front}/v1/chat/completions", json=BODY,
                              headers={"X-Conversation-Id": conversation}, timeout=10) as response:
                owner = {"X-Resume-Token": response.headers["x-resume-token"]}
                for part in response.iter_raw():
                    before += part
                    if len(before) >= 500:
                        break
            rest = httpx.get(f"{front}/v1/stream/{conversation}", params={"from": len(before)}, headers=owner,
                             timeout=10)
            assert rest.status_code == 200, rest.text
            whole = httpx.get(f"{front}/v1/stream/{conversation}", headers=owner, timeout=10)
            assert before + rest.content == whole.content and whole.content.endswith(b"data: [DONE]\n\n")


# ---- the real model, a real browser ----

QUESTION = "Explain how plants make food."
REAL = {"TYPEWRITER_MAX_NEW_TOKENS": "160", "TYPEWRITER_MAX_ACTIVE": "2", "TYPEWRITER_MAX_CONTEXT": "1024",
        "TYPEWRITER_TRUSTED_PROXIES": "127.0.0.1", "TYPEWRITER_ALLOWED_HOSTS": "127.0.0.1,localhost"}


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.e2e
def test_a_replica_killed_mid_answer_leaves_the_page_to_finish_it_on_the_other_greedy_equal(tmp_path):
    with ExitStack() as stack:
        procs, replicas = [], []
        for name in ("a", "b"):
            proc, base = stack.enter_context(server_process(REAL, tmp_path / f"replica-{name}.log"))
            procs.append(proc)
            replicas.append(base)
        front = stack.enter_context(nginx(local_conf(free_port(), [r.removeprefix("http://") for r in replicas]),
                                          tmp_path / "nginx"))
        expected = greedy_answer(front, QUESTION)
        page = stack.enter_context(browser_page(front))

        ask(page, QUESTION)
        page.wait_for_selector(".turn:last-child .tutor[data-status=done]", timeout=ANSWER_TIMEOUT_MS)
        page.wait_for_selector(".turn:last-child .tutor[aria-busy=false]", timeout=ANSWER_TIMEOUT_MS)
        uninterrupted = answer_text(page)

        new_chat(page)
        before = tokens_received(page)
        ask(page, QUESTION)
        wait_until(lambda: tokens_received(page) >= before + 20, "20 tokens on their way to the page", timeout=120)
        writing = [i for i, base in enumerate(replicas) if metric(base, "typewriter_active_streams") > 0]
        assert len(writing) == 1, f"one replica should be writing the answer: {writing}"
        os.kill(procs[writing[0]].pid, signal.SIGKILL)
        procs[writing[0]].wait(10)
        finished(page)
        resumed = answer_text(page)
        frames = sent_frames(page)
        survivor = replicas[1 - writing[0]]
        continued = metric(survivor, 'typewriter_requests_total{reason="eos"}') + \
            metric(survivor, 'typewriter_requests_total{reason="length"}')
        # this replica was killed on purpose: server_process's check for a clean exit does not apply to it
        procs[writing[0]].returncode = 0

    assert resumed["saved"] == uninterrupted["saved"] == expected
    assert resumed["shown"] == uninterrupted["shown"]
    assert any(f.get("type") == "chat" and "continue" in f for f in frames), "the page never continued the answer"
    print([{k: (len(v["ids"]) if k == "continue" else v) for k, v in f.items() if k != "messages"} for f in frames])
    assert continued >= 1
