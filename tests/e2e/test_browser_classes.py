"""A class in a real browser against a real server (uvicorn on a loopback port, the real app, the engine on a
scripted runner): a student opens the teacher's link `/?class=CODE`, lands on `/` with the class named in the header
and the guided tutor's note, asks, and the engine is asked with the class's prompt; the identity cookie is out of the
page's scripts' reach. A server for its classes only shows the join form alone, and typing the code joins. No serious
accessibility problem (axe-core) on either page, at phone size, and no console error or CSP violation."""

from __future__ import annotations

import pytest
from live_server import running
from page_harness import ARTIFACTS, CSP_WATCH, browser, csp_violations
from playwright.sync_api import expect
from scripted import factory, script_engine

pytestmark = [pytest.mark.browser]
__all__ = ["browser"]  # the shared fixture

PHONE = {"width": 390, "height": 844}
CLASSES = """
[[class]]
name = "Algebra 1"
join = "ALG1-7QX2"
[class.tutor]
subject = "algebra"
guided = true
"""


@pytest.fixture
def classes_file(tmp_path):
    def write(open_: bool = True) -> str:
        path = tmp_path / "classes.toml"
        path.write_text(("" if open_ else "open = false\n") + CLASSES)
        return str(path)

    return write


def axe(page, address: str) -> list[dict]:
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(url=f"http://{address}/static/vendor/axe/axe.min.js")
    found = page.evaluate("""() => axe.run(document, {resultTypes: ["violations"]})
        .then(r => r.violations.map(v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(" "))})))""")
    return [v for v in found if v["impact"] in ("serious", "critical")]


def watched(browser, errors: list[str]):
    context = browser.new_context(viewport=PHONE, has_touch=True, is_mobile=True)
    context.add_init_script(CSP_WATCH)
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    return context, page


def test_a_student_joins_by_the_teachers_link_and_the_class_tutor_answers(browser, classes_file):
    engine = script_engine(system_prompt=True)
    errors: list[str] = []
    with running(factory(engine), classes=classes_file()) as (_, address):
        context, page = watched(browser, errors)
        try:
            page.goto(f"http://{address}/?class=alg1-7qx2")
            assert page.url == f"http://{address}/"  # the code left the address bar
            expect(page.locator(".class-name")).to_have_text("Algebra 1")
            expect(page.locator(".empty")).to_contain_text("a step at a time")
            page.wait_for_selector("#status[data-state=ok]", timeout=10_000)
            assert not (found := axe(page, address)), found
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "class-empty-390x844.png"))
            page.fill("#question", "What is x if 2x equals 6?")
            page.keyboard.press("Enter")
            page.wait_for_selector(".turn:last-child .tutor[aria-busy=false]", timeout=10_000)
            expect(page.locator(".turn:last-child .tutor")).to_contain_text("Hello, world!")
            assert "typewriter-student" not in page.evaluate("() => document.cookie")  # HttpOnly
            page.screenshot(path=str(ARTIFACTS / "class-joined-390x844.png"))
            errors += [f"CSP violation: {v}" for v in csp_violations(page)]
        finally:
            context.close()
    assert not errors, errors
    (_, system), = engine.tokenizer.calls
    assert system.endswith("and wait for their answer.") and "You tutor algebra" in system


def test_a_server_for_its_classes_only_shows_the_join_form_and_the_code_joins(browser, classes_file):
    errors: list[str] = []
    with running(factory(script_engine()), classes=classes_file(open_=False)) as (_, address):
        context, page = watched(browser, errors)
        try:
            page.goto(f"http://{address}/")
            expect(page.locator("h2")).to_have_text("Join your class")
            expect(page.locator("#question")).to_have_count(0)
            assert not (found := axe(page, address)), found
            page.screenshot(path=str(ARTIFACTS / "class-join-only-390x844.png"))
            page.fill("#class-code", "nope-0000")
            page.click(".join button")
            expect(page.locator(".join-note")).to_contain_text("That class code is not known here")
            page.fill("#class-code", "alg1-7qx2")
            page.click(".join button")
            expect(page.locator(".class-name")).to_have_text("Algebra 1")
            page.wait_for_selector("#status[data-state=ok]", timeout=10_000)
            errors += [f"CSP violation: {v}" for v in csp_violations(page)]
        finally:
            context.close()
    assert not errors, errors
