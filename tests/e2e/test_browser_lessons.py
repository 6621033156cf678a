"""What a lesson needs, in a real browser under the page's CSP: formulas, coloured code, kept chats, quiet notices,
comfort settings and an accessibility check. The page and its stand-in socket come from page_harness.py;
every test also fails on any page error, console error or CSP violation (see `open_page`)."""

from __future__ import annotations

import json

import pytest
from page_harness import (
    DESKTOP,
    ORIGIN,
    PHONE,
    SOCKET,
    FakeTutor,
    ask,
    browser,
    end,
    open_page,
    screenshot,
    start,
    token,
    wait_done,
)
from playwright.sync_api import expect

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


CHATS_KEY = "typewriter.chats.v1"


def _titles(page) -> list[str]:
    return page.locator("#chats .chat-title").all_inner_texts()


def _questions(page) -> list[str]:
    return page.locator(".turn .bubble").all_inner_texts()


def test_chats_are_kept_named_opened_and_deleted_and_a_reload_keeps_them(browser):
    with open_page(browser, PHONE, "dark") as (page, tutor, _):
        tutor.answer = "Cells are the units of life."
        ask(page, "What is a cell?")
        wait_done(page)
        page.click("#new-chat")
        expect(page.locator(".turn")).to_have_count(0)
        tutor.answer = "Atoms are tiny."
        ask(page, "What is an atom?")
        wait_done(page)
        assert len(tutor.chats[-1]["messages"]) == 1, "a new chat starts without the old one's turns"

        page.click("#chats-button")
        dialog = page.locator("#chats")
        expect(dialog).to_be_visible()
        assert _titles(page) == ["What is an atom?", "What is a cell?"]
        assert dialog.locator(".chat-open[aria-current=true] .chat-title").inner_text() == "What is an atom?"
        box = dialog.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
        screenshot(page, "chats-390x844-dark")

        dialog.locator(".chat-item").nth(1).locator(".chat-rename").click()
        page.keyboard.press("Control+A")
        page.keyboard.type("Biology")
        page.keyboard.press("Enter")
        assert _titles(page) == ["What is an atom?", "Biology"]
        dialog.locator(".chat-item").nth(1).locator(".chat-open").click()
        expect(dialog).to_be_hidden()
        assert _questions(page) == ["What is a cell?"]
        assert page.locator(".turn .answer").inner_text() == "Cells are the units of life."

        page.reload()
        page.wait_for_selector("#status[data-state=ok]")
        assert _questions(page) == ["What is a cell?"], "the open chat stays open after a reload"
        page.click("#chats-button")
        assert _titles(page) == ["What is an atom?", "Biology"]
        dialog.locator(".chat-item").first.locator(".chat-delete").click()
        assert _titles(page) == ["Biology"]
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()
        expect(page.locator("#notice-text")).to_have_text("Deleted “What is an atom?”.")
        # A mistaken tap is undone from the notice; then deleted for good.
        page.click("#notice-undo")
        expect(page.locator("#notice")).to_be_hidden()
        page.click("#chats-button")
        assert _titles(page) == ["What is an atom?", "Biology"]
        dialog.locator(".chat-item").first.locator(".chat-delete").click()
        page.keyboard.press("Escape")
        page.reload()
        page.wait_for_selector("#status[data-state=ok]")
        page.click("#chats-button")
        assert _titles(page) == ["Biology"]


def test_editing_a_question_asks_it_again_and_drops_the_turns_after_it(browser):
    with open_page(browser, DESKTOP, "light") as (page, tutor, _):
        for q in ("First question?", "Second question?", "Third question?"):
            tutor.answer = f"Answer to {q}"
            ask(page, q)
            wait_done(page)
        page.locator(".turn").nth(1).locator(".edit").click()
        editor = page.locator(".turn").nth(1).locator(".edit-box")
        expect(editor).to_be_focused()
        assert editor.input_value() == "Second question?"
        editor.fill("Second question, better put?")
        tutor.answer = "A better answer."
        page.keyboard.press("Enter")
        wait_done(page)
        assert _questions(page) == ["First question?", "Second question, better put?"]
        assert [m["content"] for m in tutor.chats[-1]["messages"]] == [
            "First question?", "Answer to First question?", "Second question, better put?"]
        page.reload()
        page.wait_for_selector("#status[data-state=ok]")
        assert _questions(page) == ["First question?", "Second question, better put?"]
        assert page.locator(".turn").last.locator(".answer").inner_text() == "A better answer."
        # Esc leaves an editor without sending, and without stopping anything.
        page.locator(".turn").first.locator(".edit").click()
        page.keyboard.press("Escape")
        assert page.locator(".edit-box").count() == 0 and len(tutor.chats) == 4


def test_when_the_list_is_full_the_oldest_chat_goes_first_and_a_notice_says_so(browser):
    with open_page(browser, PHONE, "light") as (page, tutor, _):
        chats = [{"id": f"old{i}", "title": "", "updated": 1000 + i,
                  "turns": [{"id": "r", "question": f"Old question {i}", "answer": "old answer", "status": "done",
                             "note": "", "stats": ""}]} for i in range(40)]
        # The page saves its chats as it goes away, so the full list is written after that, on the way out.
        page.evaluate("""([key, value]) => addEventListener("pagehide", () => localStorage.setItem(key, value))""",
                      [CHATS_KEY, json.dumps({"current": "old39", "chats": chats})])
        page.reload()
        page.wait_for_selector("#status[data-state=ok]")
        assert _questions(page) == ["Old question 39"]
        page.click("#new-chat")
        ask(page, "A new question")
        wait_done(page)
        expect(page.locator("#notice-text")).to_have_text("Your oldest chat, “Old question 0”, was removed to make room.")
        page.click("#chats-button")
        titles = _titles(page)
        assert len(titles) == 40 and titles[0] == "A new question" and "Old question 0" not in titles
        page.keyboard.press("Escape")
        page.click("#notice-close")
        expect(page.locator("#notice")).to_be_hidden()


def test_a_quiet_note_under_the_answer_says_when_old_messages_were_left_out(browser):
    with open_page(browser, PHONE, "dark") as (page, tutor, _):
        tutor.dropped = 4
        tutor.answer = "Here is the answer."
        ask(page, "And one more thing?")
        wait_done(page)
        note = page.locator(".turn:last-child .note")
        expect(note).to_have_text("The tutor no longer sees the first 4 messages of this chat.")
        # Under the answer, not in place of it, and quiet: the muted colour, not the error one.
        answer_box = page.locator(".turn:last-child .answer").bounding_box()
        note_box = note.bounding_box()
        assert answer_box and note_box and note_box["y"] >= answer_box["y"] + answer_box["height"]
        assert note.get_attribute("role") != "alert"


def test_with_reduced_motion_the_answer_comes_a_word_at_a_time_with_no_animation(browser):
    with open_page(browser, PHONE, "light", reduced_motion="reduce") as (page, tutor, _):
        tutor.reply = lambda frame: [start(frame["id"]), token(frame["id"], 0, "The mitochond")]
        ask(page, "What is a mitochondrion?")
        answer = page.locator(".turn:last-child .answer")
        expect(answer).to_have_text("The")
        assert answer.locator(".caret").evaluate("c => getComputedStyle(c).animationName") == "none"
        page.wait_for_timeout(600)  # well past the pacer's 300 ms: the half word is held back, not typed out
        assert answer.inner_text().strip() == "The"
        rid = tutor.chats[-1]["id"]
        tutor.send(token(rid, 1, "ria is the powerhouse"))
        expect(answer).to_have_text("The mitochondria is the")
        tutor.send(end(rid))
        expect(answer).to_have_text("The mitochondria is the powerhouse")
        wait_done(page)


def test_in_high_contrast_mode_bubbles_code_and_the_caret_stay_visible(browser):
    with open_page(browser, PHONE, "dark", forced_colors="active") as (page, tutor, _):
        tutor.reply = lambda frame: [start(frame["id"]), token(frame["id"], 0, CODE_ANSWER + "\n\nAnd $x^2$, still")]
        ask(page, "Show me code in high contrast.")
        answer = page.locator(".turn:last-child .answer")
        expect(answer).to_contain_text("still")
        text_colour = page.evaluate("() => getComputedStyle(document.body).color")
        caret = answer.locator(".caret").evaluate("c => getComputedStyle(c).backgroundColor")
        assert caret == text_colour, "the caret vanished with the backgrounds"
        bubble = page.locator(".turn:last-child .bubble").evaluate("b => getComputedStyle(b).borderTopColor")
        assert bubble == text_colour, "the question bubble has no outline in high contrast"
        figure = answer.locator("figure.code").first.evaluate("f => getComputedStyle(f).borderTopColor")
        assert figure == text_colour
        tutor.send(end(tutor.chats[-1]["id"]))
        wait_done(page)
        screenshot(page, "forced-colors-390x844")


def _axe(page) -> list[dict]:
    """axe-core's serious and critical violations on the page as it is now. The script is served from 'self'
    (static/vendor/axe), as the CSP requires; axe.run is called from the test, not by the page."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(url=f"{ORIGIN}/static/vendor/axe/axe.min.js")
    result = page.evaluate("""() => axe.run(document, {resultTypes: ["violations"]})
        .then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                           nodes: v.nodes.slice(0, 3).map(n => n.target.join(" "))})))""")
    return [v for v in result if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_serious_or_critical_accessibility_problem(browser, scheme):
    with open_page(browser, PHONE, scheme) as (page, tutor, _):
        assert not (found := _axe(page)), f"the empty page: {found}"
        tutor.answer = CODE_ANSWER + "\n\n" + MATH_ANSWER + "\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n> a quote with [a link](https://example.org)"
        tutor.dropped = 2
        ask(page, "Everything at once, please.")
        wait_done(page)
        page.locator(".turn:last-child .edit").focus()
        assert not (found := _axe(page)), f"a finished answer with code, formulas, a table, a note: {found}"
        page.locator(".turn:last-child .edit").click()
        assert not (found := _axe(page)), f"editing a question: {found}"
        page.keyboard.press("Escape")
        page.click("#chats-button")
        assert not (found := _axe(page)), f"the chat list: {found}"
        page.locator("#chats .chat-rename").first.click()
        assert not (found := _axe(page)), f"renaming a chat: {found}"


def test_the_keyboard_reaches_everything_in_reading_order(browser):
    with open_page(browser, DESKTOP, "light") as (page, tutor, _):
        tutor.answer = "```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |"
        ask(page, "Code and a table?")
        wait_done(page)
        page.focus("#chats-button")
        order = ["chats-button"]
        for _ in range(12):
            page.keyboard.press("Tab")
            order.append(page.evaluate("""() => { const e = document.activeElement;
                return e.id || e.getAttribute('aria-label') || e.className || e.tagName; }"""))
        expected = ["chats-button", "new-chat", "thread", "Edit this question and ask it again",
                    "Copy the Python code", "pre", "Table", "Copy this answer",
                    "Regenerate: write a new answer to this question", "question", "send"]
        got = [("pre" if o == "PRE" else o) for o in order]
        assert got[:len(expected)] == expected, got
        # The chat list is a modal dialog: focus goes in, and back to its button when it closes.
        page.focus("#chats-button")
        page.keyboard.press("Enter")
        assert page.evaluate("() => document.activeElement.classList.contains('chat-open')")
        page.keyboard.press("Escape")
        assert page.evaluate("() => document.activeElement.id") == "chats-button"


def test_two_tabs_share_the_chat_list_without_undoing_each_other(browser):
    with open_page(browser, DESKTOP, "dark") as (page, tutor, errors):
        other = page.context.new_page()
        other.on("pageerror", lambda e: errors.append(f"page error (second tab): {e}"))
        other_tutor = FakeTutor()
        other.route_web_socket(SOCKET, other_tutor.attach)
        other.goto(ORIGIN + "/")
        other.wait_for_selector("#status[data-state=ok]")
        ask(page, "Asked in the first tab")
        wait_done(page)
        other.click("#new-chat")
        ask(other, "Asked in the second tab")
        wait_done(other)
        # The first tab saves again (a new chat): the second tab's chat must survive that.
        page.click("#new-chat")
        ask(page, "Asked in the first tab again")
        wait_done(page)
        page.reload()
        page.wait_for_selector("#status[data-state=ok]")
        page.click("#chats-button")
        assert sorted(_titles(page)) == ["Asked in the first tab", "Asked in the first tab again", "Asked in the second tab"]
        other.close()


def test_undo_brings_back_the_only_chat_deleted_while_it_was_open(browser):
    with open_page(browser, PHONE, "light") as (page, tutor, _):
        ask(page, "My only chat")
        wait_done(page)
        page.click("#chats-button")
        page.locator("#chats .chat-delete").click()
        assert _titles(page) == ["New chat"]
        page.keyboard.press("Escape")
        assert _questions(page) == []
        page.click("#notice-undo")
        assert _questions(page) == ["My only chat"]
        page.click("#chats-button")
        assert _titles(page) == ["My only chat"], "the empty chat that stood in for it is gone again"
