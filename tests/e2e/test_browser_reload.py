"""A page reloaded mid-answer finds its answer again: a real browser (Chromium), a real server (`typewriter serve`)
and the real model, greedy (resume_page.py).

The page asks a question once without a reload, then in a new chat again and is reloaded once the answer is coming
in (as a phone reloads a tab it discarded in the background). After the reload the answer must finish by itself and
be the uninterrupted one exactly, as kept and as shown (nothing shown twice), with the server having run one chat
for it (one `chat_end` line in its log, taken over with `resume`, never asked again), and the page must never have
shown the answer as interrupted or its question as waiting to be asked again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import wait_until
from real_server import http_get, real_server
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

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

QUESTION = "Write a long story about a river and the animals that live in it."  # up to LONGEST tokens
# Seconds of writing: the stop test's stop lands 300-500 ms in (going offline, Stop, a question, back online), and
# 400 tokens took the model 1-1.8 s beside Chromium, a margin a faster machine would take away
LONGEST = 1000  # the server's default cap
SETTINGS = {"TYPEWRITER_MAX_NEW_TOKENS": str(LONGEST), "TYPEWRITER_MAX_ACTIVE": "2", "TYPEWRITER_MAX_CONTEXT": "2048"}

# An answer that will not change by itself any more: a reloaded page that lost its answer shows it interrupted at once.
OVER = ", ".join(f"[data-status={s}]" for s in ("done", "stopped", "failed", "interrupted"))

# Every status the answers' articles take, from the page's first moment on (a reload starts the list again).
STATUSES = """
(() => {
  window.__statuses = [];
  new MutationObserver((records) => {
    for (const r of records) {
      const nodes = r.type === "attributes" ? [r.target] : [...r.addedNodes].flatMap((n) => n.querySelectorAll ? [...n.querySelectorAll(".tutor")] : []);
      for (const n of nodes) if (n.classList?.contains("tutor")) window.__statuses.push(n.dataset.status);
    }
  }).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ["data-status"] });
})();
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with real_server(SETTINGS, log) as base:
        yield base, log


def chat_ends(log: Path, turn_id: str) -> list[dict]:
    """The server's `chat_end` records of the chats asked with this id."""
    records = []
    for line in log.read_text().splitlines():
        start = line.find('{"event": "chat_end"')
        if start != -1 and (record := json.loads(line[start:]))["chat_id"] == turn_id:
            records.append(record)
    return records


def resumes(base: str) -> float:
    _, body = http_get(base + "/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith('typewriter_resumes_total{outcome="resumed"}'))


def test_a_page_reloaded_mid_answer_shows_it_once_and_finishes_it_as_without_the_reload(server):
    base, log = server
    expected = greedy_answer(base, QUESTION)
    with browser_page(base) as page:
        page.context.add_init_script(STATUSES)
        ask(page, QUESTION)
        finished(page)
        whole = answer_text(page)

        new_chat(page)
        before = tokens_received(page)
        ask(page, QUESTION)
        wait_until(lambda: tokens_received(page) >= before + 10, "the answer is coming in", timeout=120)
        turn_id = next(f["id"] for f in reversed(sent_frames(page)) if f["type"] == "chat")
        resumed_before = resumes(base)
        page.reload()
        page.wait_for_selector(f".turn:last-child .tutor:is({OVER})", timeout=ANSWER_TIMEOUT_MS)
        status = page.locator(".turn:last-child .tutor").get_attribute("data-status")
        assert status == "done", f"after the reload the answer is {status}, not found again"
        finished(page)
        reloaded = answer_text(page)
        after_reload = sent_frames(page)
        statuses = page.evaluate("window.__statuses")
        turns = page.locator(".turn").count()
        saved_progress = page.evaluate("sessionStorage.getItem('typewriter.resume.v1')")

    assert whole["saved"] == expected, "the page's greedy answer is the server's"
    assert reloaded["saved"] == expected, "the answer after the reload has a character repeated or missing"
    assert reloaded["shown"] == whole["shown"], "the screen shows the answer otherwise than without the reload"
    assert turns == 1, "the reloaded chat shows its one question once"
    assert [f["type"] for f in after_reload] == ["resume"] and after_reload[0]["from"] > 0, after_reload
    assert statuses and set(statuses) <= {"streaming", "done"}, statuses  # never interrupted, never waiting
    assert saved_progress is None, "the resume token is forgotten once the answer ended"
    wait_until(lambda: len(chat_ends(log, turn_id)) >= 1, "the server logged the chat's end", timeout=10)
    ends = chat_ends(log, turn_id)
    assert len(ends) == 1 and ends[0]["reason"] in ("eos", "length", "repetition"), ends  # one chat, never asked again
    assert resumes(base) == resumed_before + 1


def test_stop_pressed_while_offline_reaches_the_server_when_it_is_back_and_a_next_question_follows(server):
    base, log = server
    with browser_page(base) as page:
        ask(page, QUESTION)
        wait_until(lambda: tokens_received(page) >= 10, "the answer is coming in", timeout=120)
        turn_id = next(f["id"] for f in reversed(sent_frames(page)) if f["type"] == "chat")
        page.context.set_offline(True)
        page.click("#stop")
        stopped = page.locator(".turn").last.locator(".tutor").get_attribute("data-status")
        ask(page, "What is a river?")  # asked while still offline: it waits behind the stop
        sent_offline = len(sent_frames(page))
        page.context.set_offline(False)
        finished(page)
        after = sent_frames(page)[sent_offline:]
        turns = page.locator(".turn").count()
    assert stopped == "stopped"
    assert [f["type"] for f in after] == ["resume", "stop", "chat"], after
    assert after[0]["id"] == after[1]["id"] == turn_id
    assert turns == 2
    wait_until(lambda: chat_ends(log, turn_id), "the server logged the stopped chat's end", timeout=10)
    [end] = chat_ends(log, turn_id)
    assert (end["reason"], end.get("cancelled_by")) == ("cancelled", "stop"), end
    assert end["completion_tokens"] < LONGEST, "the chat ran to its end: the stop came too late"
