"""The status line while the model loads, in a real browser against a real server (uvicorn on a loopback port, the
real app, a scripted engine whose load reports int8-lite's progress and then waits for the test): a student reads
a plain sentence with how much is done and about how long is left, a developer (`?dev=1`) the server's own words
too, and neither is cut off on a 1280 px screen or a 375 px phone: the line wraps, it is never clipped."""

from __future__ import annotations

import re
import threading
import time

import pytest
from live_server import running
from page_harness import ARTIFACTS, browser
from playwright.sync_api import Page, expect
from scripted import script_engine

pytestmark = [pytest.mark.browser]
__all__ = ["browser"]  # the shared fixture

PROGRAMS_6_S = 2.0  # between the two counts the load reports: 20 programs left at that rate take about 6.7 s
STUDENT = re.compile(r"^Getting the tutor ready: 37%… about [1-7] s left$")
DEVELOPER = re.compile(r"^Getting the tutor ready: 37%… about [1-7] s left \(int8-lite: program 12/32\)$")


def counted_load(engine, gate: threading.Event):
    """An engine factory whose load reports as int8-lite's does, a count and then another, then waits for `gate`."""

    def load(settings, progress):
        progress("loading /models/SmolLM2-135M-Instruct.Q4_1.gguf")
        progress("int8-lite: rotating the weights")
        progress("int8-lite: program 6/32")
        time.sleep(PROGRAMS_6_S)
        progress("int8-lite: program 12/32")
        assert gate.wait(timeout=60), "the test never let the model finish loading"
        return engine, engine.tokenizer

    return load


def fits(page: Page) -> dict:
    """How #status's text compares to its box and the screen: nothing may stick out or be hidden."""
    return page.locator("#status").evaluate("""s => {
        const r = s.getBoundingClientRect(), style = getComputedStyle(s);
        return {scroll: [s.scrollWidth, s.clientWidth, s.scrollHeight, s.clientHeight], left: r.left,
                right: r.right, screen: window.innerWidth, ellipsis: style.textOverflow === "ellipsis",
                whiteSpace: style.whiteSpace, text: s.textContent, shown: s.innerText};
    }""")


@pytest.mark.parametrize("width, height", [(1280, 800), (375, 812)], ids=["desktop-1280", "phone-375"])
def test_the_loading_status_is_a_whole_plain_sentence_with_the_share_done_and_the_time_left(browser, width, height):
    engine, gate = script_engine(), threading.Event()
    with running(counted_load(engine, gate), ready=False) as (server, address):
        pages = {}
        context = browser.new_context(viewport={"width": width, "height": height}, is_mobile=width < 500,
                                      has_touch=width < 500)
        try:
            for view, path in (("student", "/"), ("developer", "/?dev=1")):
                pages[view] = page = context.new_page()
                page.goto(f"http://{address}{path}")
            expect(pages["student"].locator("#status")).to_have_text(STUDENT, timeout=10_000)
            expect(pages["developer"].locator("#status")).to_have_text(DEVELOPER, timeout=5_000)
            for view, page in pages.items():
                shown = fits(page)
                scroll_width, client_width, scroll_height, client_height = shown["scroll"]
                assert scroll_width <= client_width and scroll_height <= client_height, (view, shown)
                assert shown["left"] >= 0 and shown["right"] <= shown["screen"], (view, shown)
                assert not shown["ellipsis"] and shown["whiteSpace"] != "nowrap", (view, shown)
                assert shown["shown"].strip() == shown["text"].strip(), (view, shown)  # every word drawn
                expect(page.locator("#status")).to_be_in_viewport(ratio=1)
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / f"page-loading-{view}-{width}.png"))
            assert "int8" not in fits(pages["student"])["text"]  # engine words are the developer's
            gate.set()
            for page in pages.values():
                expect(page.locator("#status")).to_have_text("Connected · SmolLM2-135M-Instruct", timeout=10_000)
        finally:
            context.close()


def test_a_long_developer_status_on_a_phone_wraps_onto_more_lines_instead_of_being_cut(browser):
    engine, gate = script_engine(), threading.Event()

    def load(settings, progress):
        progress("compiled 3/12: prefill_chunk_64_slots_8_positions_2048_with_a_very_long_program_name")
        assert gate.wait(timeout=60)
        return engine, engine.tokenizer

    with running(load, ready=False) as (server, address):
        context = browser.new_context(viewport={"width": 375, "height": 812}, is_mobile=True, has_touch=True)
        try:
            page = context.new_page()
            page.goto(f"http://{address}/?dev=1")
            status = page.locator("#status")
            expect(status).to_have_text(re.compile(r"^Getting the tutor ready: 25%… \(compiled 3/12: "), timeout=10_000)
            shown = fits(page)
            assert shown["scroll"][0] <= shown["scroll"][1] and shown["scroll"][2] <= shown["scroll"][3], shown
            assert shown["right"] <= shown["screen"], shown
            line_height = float(status.evaluate("s => parseFloat(getComputedStyle(s).lineHeight) || 16"))
            assert status.bounding_box()["height"] > 1.5 * line_height, "the long line did not wrap"
        finally:
            gate.set()
            context.close()
