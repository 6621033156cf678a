"""What a lesson needs, in a real browser under the page's CSP: formulas, coloured code, kept chats, quiet notices,
comfort settings and an accessibility check. The page and its stand-in socket come from test_browser_page.py;
every test also fails on any page error, console error or CSP violation (see `open_page`)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect
from test_browser_page import DESKTOP, PHONE, ORIGIN, ask, browser, end, open_page, screenshot, start, token, wait_done

pytestmark = [pytest.mark.browser]
__all__ = ["browser"]  # the shared fixture

MATH_ANSWER = r"""The area of a circle is $A = \pi r^2$, and \(e^{i\pi} + 1 = 0\).

$$
x = \frac{-b \pm \sqrt{b^2 - 4ac}}{2a}
$$

Also \[ \sum_{k=1}^{n} k = \frac{n(n+1)}{2} \] and $\pmb{v}$ and $\fcolorbox{red}{yellow}{x}$.

This one is broken: $\frac{1}{$ and this costs $5 or $10.
"""


def test_formulas_render_with_katex_under_the_csp_and_a_broken_one_shows_its_source(browser):
    with open_page(browser, PHONE, "dark") as (page, tutor, _):
        tutor.answer = MATH_ANSWER
        ask(page, "Show me some formulas.")
        wait_done(page)
        answer = page.locator(".turn:last-child .answer")
        expect(answer.locator(".math")).to_have_count(6)
        expect(answer.locator(".math-display")).to_have_count(2)
        assert answer.locator(".katex-error").count() == 0
        assert answer.locator(".math-source").all_inner_texts() == [r"$\frac{1}{$"]
        assert "costs $5 or $10." in answer.inner_text()
        # KaTeX's own fonts, from 'self': the fraction is laid out in KaTeX_Main, not a fallback.
        assert page.evaluate("() => document.fonts.check('16px KaTeX_Main')")
        assert page.evaluate("() => [...document.fonts].some(f => f.family === 'KaTeX_Main' && f.status === 'loaded')")
        # The quadratic formula stands on two lines: a fraction laid out, not TeX source in one line of text.
        frac = answer.locator(".math-display").first.bounding_box()
        assert frac and frac["height"] > 2.2 * 16, frac
        # KaTeX sized its boxes through the CSSOM, which the CSP allows; formulas cloned from the page's cache
        # of laid-out formulas keep those sizes.
        assert answer.evaluate("a => [...a.querySelectorAll('.katex-html .strut')].every(s => s.style.height)")
        # The MathML half is there for screen readers.
        assert answer.locator("math").count() == 6
        screenshot(page, "math-390x844-dark")


def test_while_streaming_an_unfinished_formula_is_plain_text_until_it_closes(browser):
    with open_page(browser, DESKTOP, "light") as (page, tutor, _):
        tutor.reply = lambda frame: [start(frame["id"]), token(frame["id"], 0, r"The area is $\pi r")]
        ask(page, "Area of a circle?")
        answer = page.locator(".turn:last-child .answer")
        expect(answer).to_contain_text(r"The area is $\pi r")
        assert answer.locator(".math").count() == 0
        rid = tutor.chats[-1]["id"]
        tutor.send(token(rid, 1, "^2$ square"))
        expect(answer.locator(".math")).to_have_count(1)
        expect(answer).to_contain_text("square")
        assert "$" not in answer.inner_text(), "the formula's source is still shown beside it"
        tutor.send(token(rid, 2, r" units, and \[ A = \pi"))
        expect(answer).to_contain_text(r"\[ A = \pi")
        assert answer.locator(".math-display").count() == 0
        tutor.send(token(rid, 3, r" r^2 \]"))
        tutor.send(end(rid))
        expect(answer.locator(".math-display")).to_have_count(1)
        wait_done(page)


CODE_ANSWER = """Here it is:

```python
def square(x):
    # multiply
    return x * x  # <b>not bold</b>
```

```sql
SELECT name FROM pupils WHERE age > 11;
```
"""


def test_code_is_coloured_labelled_and_copied_with_its_own_button(browser):
    with open_page(browser, PHONE, "light", permissions=["clipboard-read", "clipboard-write"]) as (page, tutor, _):
        tutor.answer = CODE_ANSWER
        ask(page, "Show me a function.")
        wait_done(page)
        figures = page.locator(".turn:last-child figure.code")
        expect(figures).to_have_count(2)
        python = figures.first
        assert python.locator(".code-lang").inner_text() == "Python"
        assert figures.nth(1).locator(".code-lang").inner_text() == "SQL"
        assert python.locator(".hljs-keyword").first.inner_text() == "def"
        assert python.locator(".hljs-comment").count() == 2
        assert python.locator("b").count() == 0, "model text became markup"
        # Coloured for real: a keyword's colour differs from plain code's.
        colours = python.evaluate("""f => [getComputedStyle(f.querySelector('.hljs-keyword')).color,
                                           getComputedStyle(f.querySelector('code')).color]""")
        assert colours[0] != colours[1], colours
        python.locator(".code-copy").click()
        expect(python.locator(".code-copy")).to_have_text("Copied")
        copied = page.evaluate("() => navigator.clipboard.readText()")
        assert copied == 'def square(x):\n    # multiply\n    return x * x  # <b>not bold</b>'
        box = python.locator(".code-copy").bounding_box()
        assert box and box["height"] >= 44 and box["width"] >= 44
        screenshot(page, "code-390x844-light")
