"""Whose share of the compiled constraints a chat's constraint counts in: the client the server's other limits count
(a student by the page's cookie, a classes-file key, else the address, the forwarded one behind a trusted proxy),
so that one client's compiles never push out another's. Over a real server on a real socket, a real engine over the
tiny byte-level tokenizer, its cache read directly."""

from __future__ import annotations

import httpx
import live_server
import pytest
from scripted import ChainRunner, RecordingEngine, factory, letters
from tiny_model import VOCAB_SIZE

from typewriter.engine.constraints import Grammars
from typewriter.text.tokenizer import Tokenizer

SMALL = 32 << 10  # what each small regex below is estimated to take: the floor
STUDENT, SCRIPT = "198.51.100.1", "198.51.100.2"


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf):
    return Tokenizer.load(tiny_gguf)


def engine_of(tokenizer, grammars: Grammars | None = None) -> RecordingEngine:
    engine = RecordingEngine(ChainRunner(letters(), VOCAB_SIZE, slots=2, max_len=256), tokenizer, max_queue=8,
                             prefill_budget=64)
    if grammars is not None:
        engine.grammars = grammars
    return engine.start()


def regex(i: int) -> str:
    return f"item {i}: [a-z]{{1,8}}"


def ask(client: httpx.Client, i: int, forwarded: str | None = None) -> None:
    response = client.post("/v1/chat/completions", headers={"X-Forwarded-For": forwarded} if forwarded else {},
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                 "response_format": {"type": "regex", "regex": regex(i)}})
    assert response.status_code == 200, response.text


def key(i: int) -> tuple[str, str]:
    return ("regex", regex(i))


def test_a_constraint_counts_in_the_share_of_the_address_a_trusted_proxy_forwards(tokenizer):
    engine = engine_of(tokenizer)
    with live_server.running(factory(engine), trusted_proxies="127.0.0.1") as (_, address), \
            httpx.Client(base_url=f"http://{address}", timeout=30) as client:
        ask(client, 1, STUDENT)
        ask(client, 1, SCRIPT)
    kept = engine.grammars._kept
    assert kept.get(STUDENT, key(1)) is not None and kept.get(SCRIPT, key(1)) is not None
    assert kept.held(STUDENT) == kept.held(SCRIPT) == kept.bytes // 2 > 0


def test_a_forged_address_from_an_untrusted_peer_counts_in_that_peers_share(tokenizer):
    engine = engine_of(tokenizer)
    with live_server.running(factory(engine)) as (_, address), \
            httpx.Client(base_url=f"http://{address}", timeout=30) as client:
        ask(client, 1, STUDENT)
    kept = engine.grammars._kept
    assert kept.held("127.0.0.1") == kept.bytes > 0 and kept.held(STUDENT) == 0


def test_a_script_sending_new_constraints_never_pushes_out_a_students_own(tokenizer):
    engine = engine_of(tokenizer, Grammars(tokenizer, VOCAB_SIZE, cache_bytes=6 * SMALL, owner_bytes=3 * SMALL))
    with live_server.running(factory(engine), trusted_proxies="127.0.0.1") as (_, address), \
            httpx.Client(base_url=f"http://{address}", timeout=30) as client:
        ask(client, 0, STUDENT)
        student = engine.grammars._kept.get(STUDENT, key(0))
        for i in range(1, 21):
            ask(client, i, SCRIPT)
        kept = engine.grammars._kept
        assert kept.get(STUDENT, key(0)) is student is not None
        assert kept.held(SCRIPT) <= 3 * SMALL and kept.bytes <= 6 * SMALL
        assert kept.get(SCRIPT, key(20)) is not None and kept.get(SCRIPT, key(1)) is None  # its own oldest went


def test_two_students_behind_one_address_each_keep_theirs_in_their_own_share(tokenizer):
    engine = engine_of(tokenizer)
    with live_server.running(factory(engine)) as (_, address):
        students = [httpx.Client(base_url=f"http://{address}", timeout=30) for _ in range(2)]
        for student in students:
            student.get("/").raise_for_status()  # the page issues each its own student cookie
            ask(student, 1)
        for student in students:
            student.close()
    kept = engine.grammars._kept
    owners = [owner for owner, _, _ in kept._entries]
    assert len(set(owners)) == 2 and all(owner.startswith("student:") for owner in owners)
    assert kept.held("127.0.0.1") == 0
