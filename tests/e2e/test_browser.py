"""The tutoring page in a real browser against a real server and the real model.

Debian's Chromium (`apt-get install -y chromium`) is driven headless by Playwright for Python; no browser is
downloaded. The server is `python -m typewriter serve` on a free port, with short answers so the test does
not wait on a CPU model writing 512 tokens. The tests share one server, one browser context and one page,
and run in order: ask, stop, reload. A screenshot of a finished answer is saved under artifacts/.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright
from real_server import ROOT, http_get, real_server

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
ANSWER_TIMEOUT_MS = 180_000
ESSAY = "Write a long, detailed essay about the history of mathematics, from Babylon to today."  # seconds of answer
ESC_TRIES = 5  # answers asked until one is still streaming when Esc is pressed
GROWTH_TIMEOUT_MS = 30_000  # a streaming answer shows new text far more often than this
STORAGE_KEY = "typewriter.chats.v1"  # frontend/chats.js


def _cancelled_total(base: str) -> float:
    _, text = http_get(f"{base}/metrics")
    match = re.search(r'^typewriter_requests_total\{reason="cancelled"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _eventually(check, what: str, timeout_s: float = 10.0) -> None:
    """Poll `check` until it is true. The page's CSP forbids eval, so page.wait_for_function cannot do this."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.05)


def _saved_turns(page) -> list[dict]:
    """The open chat's turns as the page last saved them to localStorage."""
    saved = page.evaluate("key => localStorage.getItem(key)", STORAGE_KEY)
    if not saved:
        return []
    chats = json.loads(saved)
    return next(c["turns"] for c in chats["chats"] if c["id"] == chats["current"])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if url := os.environ.get("TYPEWRITER_TEST_SERVER_URL"):  # an already running server, e.g. while developing
        yield url.rstrip("/")
        return
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    # Essays of up to 600 tokens (the page asks for no length: the server's default applies): the tests that stop an
    # essay, or need two running while a third student waits, act some 20-50 tokens in; 96 tokens left them a margin
    # of about three times the model's speed
    settings = {"TYPEWRITER_MAX_NEW_TOKENS": "600", "TYPEWRITER_MAX_ACTIVE": "2", "TYPEWRITER_MAX_CONTEXT": "4096"}
    with real_server(settings, log_path) as base:
        yield base


@pytest.fixture(scope="module")
def page(server):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1100, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{server}/?dev=1")  # the developer setting: the page's own figures under each answer
        page.wait_for_selector("#status[data-state=ok]", timeout=30_000)
        yield page
        assert not errors, f"the page logged errors: {errors}"
        context.close()
        browser.close()


def _ask(page, question: str) -> None:
    page.fill("#question", question)
    page.keyboard.press("Enter")


def _last_answer(page):
    return page.locator(".turn").last.locator(".answer")


def test_an_answer_types_itself_out_and_then_ends(page):
    turns_before = page.locator(".turn").count()
    _ask(page, "In two or three sentences, what is photosynthesis?")
    answer = _last_answer(page)
    expect(answer).to_have_text(re.compile(r"\S"), timeout=ANSWER_TIMEOUT_MS)

    # The answer grows visibly: each snapshot waits for the text on screen to differ from the one before.
    snapshots = [answer.inner_text()]
    for _ in range(2):
        expect(answer).not_to_have_text(snapshots[-1], use_inner_text=True, timeout=GROWTH_TIMEOUT_MS)
        snapshots.append(answer.inner_text())
    page.wait_for_selector(".turn:last-child .tutor[aria-busy=false]", timeout=ANSWER_TIMEOUT_MS)

    final = answer.inner_text()
    assert page.locator(".turn").count() == turns_before + 1
    assert page.locator(".turn:last-child .tutor").get_attribute("data-status") == "done"
    assert len(final.strip()) > len(snapshots[0].strip())
    assert re.match(r"first character \d+\.\d\d s after Send · [\d.]+ tokens/s, \d+ characters/s received$",
                    page.locator(".turn:last-child .stats").inner_text()), "no figures measured on the page"
    assert page.locator(".turn:last-child .caret").count() == 0

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-finished-answer.png"))


def test_stop_keeps_the_partial_answer_and_the_server_ends_it_as_cancelled(page, server):
    cancelled_before = _cancelled_total(server)
    _ask(page, ESSAY)
    # The page's CSP forbids eval, so waits use locators rather than wait_for_function.
    expect(_last_answer(page)).to_have_text(re.compile(r"\S.{19,}", re.S), timeout=ANSWER_TIMEOUT_MS)
    page.click("#stop")

    article = page.locator(".turn:last-child .tutor")
    assert article.get_attribute("data-status") == "stopped"
    assert page.locator(".turn:last-child .note").inner_text().strip() == "Stopped"
    partial = _last_answer(page).inner_text()
    assert partial.strip()

    # The server's end (reason cancelled) settles the page's figures, and the server's counter rises.
    expect(page.locator(".turn:last-child .stats")).not_to_have_text("", timeout=10_000)
    _eventually(lambda: _cancelled_total(server) > cancelled_before,
                'typewriter_requests_total{reason="cancelled"} rises')
    # The end is the chat's last frame, and once it is handled the page saves the turn with its stats: every
    # token that was on its way at Stop has been handled by then, and none of it may show or be saved.
    _eventually(lambda: _saved_turns(page)[-1]["stats"], "the stopped turn is saved with its stats")
    expect(article).to_have_attribute("aria-busy", "false")
    assert _last_answer(page).inner_text() == partial, "text changed after Stop"
    saved = _saved_turns(page)[-1]
    assert (saved["status"], saved["note"]) == ("stopped", "Stopped")  # its text: see the reload test
    assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()

    # The next question is taken at once, and Esc stops it too. The answer is sampled, and asked again after a stopped
    # one it has ended within a few tokens (12, in 48 ms) before the Esc landed: such a try is asked again. An Esc
    # that did nothing leaves the answer streaming, and fails at once.
    for _ in range(ESC_TRIES):
        _ask(page, ESSAY)
        page.wait_for_selector(".turn:last-child .tutor[data-status=streaming]", timeout=ANSWER_TIMEOUT_MS)
        page.keyboard.press("Escape")
        status = page.locator(".turn:last-child .tutor").get_attribute("data-status")
        if status == "stopped":
            break
        assert status == "done", f"Esc left the answer {status}"  # it had ended on its own
    else:
        pytest.fail(f"every one of {ESC_TRIES} answers ended before its Esc")


def test_a_reload_shows_the_conversation_again(page):
    def conversation():
        return [(t.locator(".bubble").inner_text(), t.locator(".answer").inner_text(),
                 t.locator(".tutor").get_attribute("data-status")) for t in page.locator(".turn").all()]

    # The answer stopped with Esc at the end of the last test: its end has arrived and been saved.
    _eventually(lambda: _saved_turns(page)[-1]["stats"], "the last stopped turn is saved with its stats")
    before = conversation()
    assert len(before) >= 3
    page.reload()
    page.wait_for_selector("#status[data-state=ok]", timeout=30_000)
    assert conversation() == before


def test_a_student_beyond_the_free_slots_sees_their_place_in_line_then_gets_an_answer(page, server):
    """The module's server has 2 slots: two students fill them, a third is told they are next in line."""
    browser = page.context.browser
    contexts = [browser.new_context(viewport={"width": 900, "height": 700}) for _ in range(3)]
    try:
        students = [c.new_page() for c in contexts]
        for student in students:
            student.goto(server)
            student.wait_for_selector("#status[data-state=ok]", timeout=30_000)
        for student in students[:2]:
            _ask(student, ESSAY)
            student.wait_for_selector(".tutor[data-status=streaming]", timeout=ANSWER_TIMEOUT_MS)
        third = students[2]
        _ask(third, "What is a prime number?")
        third.wait_for_selector(".tutor[data-status=queued]", timeout=10_000)
        expect(third.locator("#status")).to_have_text(re.compile("You're next|ahead of you"))
        students[0].keyboard.press("Escape")  # a slot frees up: the third student's answer starts
        third.wait_for_selector(".tutor[data-status=streaming], .tutor[data-status=done]", timeout=ANSWER_TIMEOUT_MS)
        students[1].keyboard.press("Escape")
    finally:
        for context in contexts:
            context.close()
