"""A question asked while the model loads, in a real browser against a real server (uvicorn on a loopback port,
the real app, the real engine on a scripted runner whose load waits for the test). The page says the tutor is
getting ready with the load's progress from /readyz, holds the question with Stop offered, shows no error, and
sends it once the server is ready: one chat reaches the engine, and its answer is shown. (How the loading status
reads and fits: e2e/test_browser_loading_status.py.)"""

from __future__ import annotations

import re
import threading

import pytest
from live_server import running
from page_harness import ARTIFACTS, browser
from playwright.sync_api import expect
from scripted import script_engine

pytestmark = [pytest.mark.browser]
__all__ = ["browser"]  # the shared fixture


def slow_load(engine, gate: threading.Event):
    """An engine factory whose load reports progress as int8-lite's does, then waits for `gate`."""

    def load(settings, progress):
        progress("loading /models/SmolLM2-135M-Instruct.Q4_1.gguf")
        progress("int8-lite: program 6/32")
        assert gate.wait(timeout=60), "the test never let the model finish loading"
        progress("int8-lite: program 32/32")
        return engine, engine.tokenizer

    return load


def test_a_question_asked_while_the_model_loads_waits_with_the_progress_and_is_answered_once_ready(browser):
    engine, gate = script_engine(), threading.Event()
    errors: list[str] = []
    with running(slow_load(engine, gate), ready=False) as (server, address):
        context = browser.new_context(viewport={"width": 390, "height": 844})
        try:
            page = context.new_page()
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.goto(f"http://{address}/")
            status = page.locator("#status")
            expect(status).to_have_text("Getting the tutor ready: 18%…", timeout=10_000)

            page.fill("#question", "What is a prime number?")
            page.keyboard.press("Enter")
            tutor = page.locator(".turn:last-child .tutor")
            note = page.locator(".turn:last-child .note")
            expect(note).to_have_text("Your question is kept and will be sent as soon as the tutor is ready.")
            page.wait_for_timeout(2500)  # a few of the page's looks at /readyz, and any socket it tried
            expect(tutor).to_have_attribute("data-status", "waiting")
            expect(status).to_have_text("Getting the tutor ready: 18%…")
            expect(note).not_to_have_attribute("role", "alert")  # a quiet note, not an error
            assert note.evaluate("n => getComputedStyle(n).color") == page.locator(".status").evaluate(
                "s => getComputedStyle(s, '::before').backgroundColor"), "the note is not in the waiting colour"
            expect(page.locator("#stop")).to_be_visible()  # the question can be taken back
            expect(page.locator("#send")).to_be_hidden()
            assert engine.submitted == [], "the question reached the engine before it was ready"
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "page-question-held-while-loading.png"))

            gate.set()
            expect(tutor).to_have_attribute("data-status", "done", timeout=10_000)
            expect(page.locator(".turn:last-child .answer")).to_have_text("Hello, world!")
            expect(note).to_be_hidden()
            expect(status).to_have_text("Connected · SmolLM2-135M-Instruct")
            assert page.locator(".turn").count() == 1
        finally:
            context.close()
    assert len(engine.submitted) == 1, "the held question was sent more than once, or never"
    # /readyz answers 503 while the model loads, and Chromium logs every 503 it fetches: those lines are expected.
    assert [e for e in errors if "the server responded with a status of 503" not in e] == []


def test_stop_takes_back_a_question_held_while_the_model_loads(browser):
    engine, gate = script_engine(), threading.Event()
    with running(slow_load(engine, gate), ready=False) as (server, address):
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"http://{address}/")
            expect(page.locator("#status")).to_have_text(re.compile("Getting the tutor ready"), timeout=10_000)
            page.fill("#question", "What is a prime number?")
            page.keyboard.press("Enter")
            page.click("#stop")
            tutor = page.locator(".turn:last-child .tutor")
            expect(tutor).to_have_attribute("data-status", "stopped")
            expect(page.locator("#send")).to_be_visible()
            gate.set()
            expect(page.locator("#status")).to_have_text("Connected · SmolLM2-135M-Instruct", timeout=10_000)
            page.wait_for_timeout(500)
            expect(tutor).to_have_attribute("data-status", "stopped")
        finally:
            context.close()
    assert engine.submitted == [], "a question taken back was sent anyway"
