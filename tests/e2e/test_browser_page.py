"""The page itself in a real browser, with Playwright standing in for the server (page_harness.py): layout at phone
and desktop size, the composer under a keyboard, a follow-up sent mid-answer, and the developer figures.
"""

from __future__ import annotations

import re

import pytest
from page_harness import (
    DESKTOP,
    LONG_ANSWER,
    ORIGIN,
    PHONE,
    ask,
    browser,
    end,
    open_page,
    screenshot,
    start,
    token,
    wait_done,
)
from playwright.sync_api import Page

pytestmark = [pytest.mark.browser]

__all__ = ["browser"]  # the fixture, imported for pytest to find


def overflow(page: Page) -> dict:
    """How the page's width compares to the screen's, and which visible elements stick out of it."""
    return page.evaluate("""() => {
        const w = window.innerWidth;
        const out = [];
        for (const el of document.querySelectorAll("body *")) {
            const r = el.getBoundingClientRect();
            if (r.width === 0 || el.closest(".visually-hidden")) continue;
            // Inside a box that scrolls sideways is fine: that is how code and tables fit.
            let scroller = el.parentElement, clipped = false;
            for (; scroller && scroller !== document.body; scroller = scroller.parentElement) {
                const s = getComputedStyle(scroller);
                if (s.overflowX === "auto" || s.overflowX === "scroll" || s.overflowX === "hidden") {
                    if (scroller.classList.contains("thread")) break;
                    clipped = true;
                    break;
                }
            }
            if (!clipped && (r.right > w + 0.5 || r.left < -0.5)) out.push(el.tagName + "." + el.className);
        }
        const thread = document.getElementById("thread");
        return {screen: w, page: document.documentElement.scrollWidth, body: document.body.scrollWidth,
                thread: thread.scrollWidth, threadBox: thread.clientWidth, outside: out.slice(0, 10)};
    }""")


def boxes(page: Page, selector: str) -> list[dict]:
    return page.evaluate("""sel => [...document.querySelectorAll(sel)].filter(e => e.offsetParent !== null)
        .map(e => { const r = e.getBoundingClientRect();
                    return {name: e.id || e.textContent.trim().slice(0, 20), x: r.x, y: r.y, w: r.width, h: r.height}; })""",
                         selector)


def _overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["w"] - 0.5 and b["x"] < a["x"] + a["w"] - 0.5 and \
        a["y"] < b["y"] + b["h"] - 0.5 and b["y"] < a["y"] + a["h"] - 0.5


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["phone", "desktop"])
def test_a_wide_answer_never_makes_the_page_wider_than_the_screen(browser, size, scheme):
    viewport = PHONE if size == "phone" else DESKTOP
    with open_page(browser, viewport, scheme) as (page, tutor, _):
        tutor.answer = LONG_ANSWER
        ask(page, "Show me something wide, please: code, a link, a table and a list.")
        wait_done(page)
        assert page.locator(".turn:last-child .answer table").count() == 1
        assert page.locator(".turn:last-child .answer li li li").count() == 2
        sizes = overflow(page)
        assert sizes["page"] == sizes["screen"] == viewport["width"], sizes
        assert sizes["body"] == sizes["screen"], sizes
        assert sizes["thread"] <= sizes["threadBox"], sizes
        assert not sizes["outside"], sizes
        # The code and the table scroll inside themselves instead.
        for box in (".answer pre", ".answer .table-scroll"):
            wide = page.eval_on_selector(box, "e => e.scrollWidth > e.clientWidth")
            assert wide or size == "desktop", f"{box} does not scroll on its own"
        screenshot(page, f"page-{viewport['width']}x{viewport['height']}-{scheme}")
        page.locator(".turn:last-child .answer .table-scroll").scroll_into_view_if_needed()
        screenshot(page, f"page-{viewport['width']}x{viewport['height']}-{scheme}-table")


@pytest.mark.parametrize("width", [320, 390, 430])
def test_on_a_phone_every_control_is_on_screen_big_enough_to_tap_and_apart(browser, width):
    with open_page(browser, {"width": width, "height": 700}, "dark") as (page, tutor, _):
        tutor.answer = LONG_ANSWER
        ask(page, "Something wide again?")
        wait_done(page)
        sizes = overflow(page)
        assert sizes["page"] == sizes["screen"] == width and not sizes["outside"], sizes
        controls = boxes(page, "header button, .composer button, .composer textarea, .turn:last-child button")
        assert len(controls) >= 4, controls
        for c in controls:
            assert c["h"] >= 44 and c["w"] >= 44, f"too small to tap: {c}"
            assert c["x"] >= 0 and c["x"] + c["w"] <= width + 0.5, f"off screen: {c}"
        page.click("#chats-button")
        in_dialog = boxes(page, "#chats button")
        assert len(in_dialog) >= 4
        for c in in_dialog:
            assert c["h"] >= 44 and c["w"] >= 44 and c["x"] >= 0 and c["x"] + c["w"] <= width + 0.5, c
        for a, b in ((a, b) for i, a in enumerate(in_dialog) for b in in_dialog[i + 1:]):
            assert not _overlap(a, b), f"{a} overlaps {b}"
        page.keyboard.press("Escape")
        for group in ("header > *", ".composer > :not(.hint)", ".turn:last-child .meta > *"):
            items = boxes(page, group)
            for i, a in enumerate(items):
                for b in items[i + 1:]:
                    assert not _overlap(a, b), f"{a} overlaps {b}"


def test_the_composer_stays_in_view_when_the_keyboard_takes_half_the_screen(browser):
    """interactive-widget=resizes-content: an on-screen keyboard shrinks the layout viewport, as this does."""
    with open_page(browser, PHONE, "light") as (page, tutor, _):
        tutor.answer = LONG_ANSWER
        ask(page, "Something wide again?")
        wait_done(page)
        page.set_viewport_size({"width": 390, "height": 430})
        page.focus("#question")
        box = page.locator("#question").bounding_box()
        send = page.locator("#send").bounding_box()
        assert box and send and box["y"] + box["height"] <= 430 and send["y"] + send["height"] <= 430
        assert overflow(page)["page"] == 390
        screenshot(page, "page-390x430-keyboard")


def test_a_follow_up_sent_while_an_answer_streams_stops_it_and_is_answered(browser):
    """As before this page was reworked: typing the next question and pressing Enter interrupts the answer."""
    with open_page(browser, PHONE, "dark") as (page, tutor, _):
        first = True

        def reply(frame: dict) -> list[dict]:
            nonlocal first
            if first:  # the first answer streams and never ends by itself
                first = False
                return [start(frame["id"]), token(frame["id"], 0, "Photosynthesis is how plants ")]
            return tutor.whole_answer(frame)

        tutor.reply = reply
        tutor.answer = "Chlorophyll is green."
        ask(page, "What is photosynthesis?")
        page.wait_for_selector(".turn:last-child .tutor[data-status=streaming]")
        ask(page, "And chlorophyll?")
        wait_done(page)
        statuses = [t.get_attribute("data-status") for t in page.locator(".tutor").all()]
        assert statuses == ["stopped", "done"]
        assert tutor.stops == [tutor.chats[0]["id"]]
        assert page.locator(".turn").last.locator(".answer").inner_text() == "Chlorophyll is green."


def test_the_student_sees_no_developer_figures(browser):
    with open_page(browser, PHONE, "light") as (page, tutor, _):
        ask(page, "What is a prime number?")
        wait_done(page)
        assert page.locator(".turn:last-child .stats").inner_text() == ""
        assert "tokens/s" not in page.locator("body").inner_text()


def test_with_the_developer_setting_the_page_shows_figures_it_measured_itself(browser):
    """The fake server's `end` says the first token took 0.08 s; the page waited 0.8 s for it and says so."""
    with open_page(browser, DESKTOP, "light", path="/?dev=1") as (page, tutor, _):
        tutor.reply = lambda frame: [start(frame["id"])]
        ask(page, "What is a prime number?")
        page.wait_for_selector(".turn:last-child .tutor[data-status=streaming]")
        page.wait_for_timeout(800)
        rid = tutor.chats[-1]["id"]
        for i, piece in enumerate(["A prime ", "number has ", "exactly two ", "divisors."]):
            tutor.send(token(rid, i, piece))
            page.wait_for_timeout(100)
        tutor.send(end(rid))
        wait_done(page)
        stats = page.locator(".turn:last-child .stats").inner_text()
        figures = re.fullmatch(r"first character (\d+\.\d\d) s after Send · ([\d.]+) tokens/s, (\d+) characters/s "
                               r"received", stats)
        assert figures, stats
        assert 0.8 <= float(figures.group(1)) < 3, "not the time from Send to the first character on screen"
        assert 3 <= float(figures.group(2)) <= 40 and 20 <= int(figures.group(3)) <= 400, stats  # ~3 pieces in 0.3 s

        page.goto(ORIGIN + "/")  # the setting is kept in this browser
        page.wait_for_selector("#status[data-state=ok]")
        assert page.locator(".turn:last-child .stats").inner_text() == stats
        page.goto(ORIGIN + "/?dev=0")
        page.wait_for_selector("#status[data-state=ok]")
        assert page.locator(".turn:last-child .stats").inner_text() == ""
