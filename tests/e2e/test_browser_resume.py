"""The page survives a network drop mid-answer: a real browser (Chromium, with Playwright's `set_offline`), a real
server (`typewriter serve`) and the real model.

The page is made greedy (resume_page.py), asks a question once without a drop, then in a new chat again with the
network cut for 5 s or 20 s mid-answer. The second answer must finish by itself and be the first one exactly,
as kept and as shown, with nothing repeated or missing; meanwhile the page shows only its quiet reconnecting note,
never "Try again". With reduced motion too, and the finished answer is kept in the chat across a reload.
"""

from __future__ import annotations

import os
import time

import pytest
from helpers import wait_until
from real_server import real_server
from resume_page import (
    answer_text,
    ask,
    browser_page,
    finished,
    greedy_answer,
    new_chat,
    sent_frames,
    status_text,
    tokens_received,
)

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

QUESTION = "Explain how plants make food."
# the network drops 10 tokens in: the answer must still be coming then, however fast the machine (160 tokens took
# the model 0.5-0.9 s beside Chromium)
SETTINGS = {"TYPEWRITER_MAX_NEW_TOKENS": "400", "TYPEWRITER_MAX_ACTIVE": "2", "TYPEWRITER_MAX_CONTEXT": "1024"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if url := os.environ.get("TYPEWRITER_TEST_SERVER_URL"):  # an already running server, e.g. while developing
        yield url.rstrip("/")
        return
    with real_server(SETTINGS, tmp_path_factory.mktemp("server") / "server.log") as base:
        yield base


@pytest.fixture(scope="module")
def expected(server) -> str:
    return greedy_answer(server, QUESTION)


def uninterrupted(page) -> dict[str, str]:
    ask(page, QUESTION)
    finished(page)
    return answer_text(page)


def through_a_drop(page, seconds: float) -> tuple[dict[str, str], list[str]]:
    """Ask again in a new chat and cut the network for `seconds` once the answer is coming in; (the answer, what
    the status line and the turn said while the network was down)."""
    new_chat(page)
    before = tokens_received(page)
    ask(page, QUESTION)
    wait_until(lambda: tokens_received(page) >= before + 10, "the answer is coming in", timeout=120)
    page.context.set_offline(True)
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tutor = page.locator(".turn").last.locator(".tutor")
        try_again = page.locator(".turn").last.locator(".regen")
        seen.append(f"{status_text(page)} | {tutor.get_attribute('data-status')} | "
                    f"{try_again.inner_text() if try_again.is_visible() else '-'}")
        time.sleep(0.5)
    page.context.set_offline(False)
    finished(page)
    return answer_text(page), seen


@pytest.mark.parametrize("seconds", [5, 20])
def test_an_answer_cut_by_a_network_drop_finishes_on_screen_exactly_as_without_it(server, expected, seconds):
    with browser_page(server) as page:
        whole = uninterrupted(page)
        resumed, seen = through_a_drop(page, seconds)
        frames = sent_frames(page)
    assert whole["saved"] == expected, "the page's greedy answer is the server's"
    assert resumed["saved"] == expected, "the answer after the drop has a character repeated or missing"
    assert resumed["shown"] == whole["shown"]
    assert any(f["type"] == "resume" and f["from"] > 0 for f in frames), "the page never resumed"
    assert all("| streaming |" in line and line.endswith("| -") for line in seen), seen  # no Try again
    assert any(line.startswith("Reconnecting… the answer will go on") for line in seen), seen


def test_with_reduced_motion_the_resumed_answer_is_whole_and_the_chat_keeps_it_across_a_reload(server, expected):
    with browser_page(server, reduced_motion=True) as page:
        whole = uninterrupted(page)
        resumed, _ = through_a_drop(page, 5)
        page.reload()
        page.wait_for_selector("#status[data-state=ok]", timeout=30_000)
        kept = answer_text(page)
        status = page.locator(".turn").last.locator(".tutor").get_attribute("data-status")
    assert resumed["saved"] == whole["saved"] == expected
    assert resumed["shown"] == whole["shown"]
    assert kept == resumed and status == "done"
