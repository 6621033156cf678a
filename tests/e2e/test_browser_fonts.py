"""Answers in Chinese (and Japanese, Korean) are drawn with real glyphs, in a real browser with Playwright standing
in for the server (page_harness.py). scripts/install-chromium.sh installs Debian's Noto CJK fonts beside
Chromium; without a CJK font every Han character is drawn as the same empty box."""

from __future__ import annotations

import pytest
from page_harness import DESKTOP, PHONE, ask, browser, open_page, screenshot, wait_done
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser]

__all__ = ["browser"]  # the fixture, imported for pytest to find

CHINESE = "光合作用是植物利用阳光，把水和二氧化碳变成葡萄糖和氧气的过程。"
SAMPLE = "光合作用植物阳水"  # eight different characters: eight different glyphs, or eight identical boxes

# Each character drawn alone on a canvas in the answer's own font (the same fallback the page's text takes):
# how many left ink, and how many different bitmaps they made.
GLYPHS = """(el, chars) => {
    const style = getComputedStyle(el);
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = 64;
    const ctx = canvas.getContext("2d", {willReadFrequently: true});
    const bitmaps = chars.map((c) => {
        ctx.clearRect(0, 0, 64, 64);
        ctx.font = `${style.fontWeight} 40px ${style.fontFamily}`;
        ctx.fillText(c, 8, 48);
        const alpha = ctx.getImageData(0, 0, 64, 64).data.filter((_, i) => i % 4 === 3);
        return alpha.join(",");
    });
    return {inked: bitmaps.filter((b) => /[1-9]/.test(b)).length, distinct: new Set(bitmaps).size};
}"""


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_a_chinese_answer_is_drawn_with_a_different_glyph_for_each_character(browser, viewport):
    with open_page(browser, viewport) as (page, tutor, errors):
        tutor.answer = CHINESE
        ask(page, "什么是光合作用？")
        wait_done(page)
        answer = page.locator(".turn:last-child .answer")
        expect(answer).to_have_text(CHINESE)
        drawn = answer.evaluate(GLYPHS, list(SAMPLE))
        assert drawn == {"inked": len(SAMPLE), "distinct": len(SAMPLE)}, \
            f"Chinese drawn as boxes ({drawn}): no CJK font; run scripts/install-chromium.sh"
        screenshot(page, f"page-chinese-answer-{viewport['width']}")
