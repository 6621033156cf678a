"""The page itself in a real browser, with Playwright standing in for the server: layout at phone and desktop size.

No model and no server process: Playwright answers the page's requests from the repository (templates/, static/,
frontend/) with the server's own security headers, strict CSP included, and plays the server's side of the
socket with protocol v1 frames (`FakeTutor`). So each test says exactly what the tutor answers, and when.
Debian's Chromium is driven headless; no browser is downloaded. Screenshots go to artifacts/.

`open_page` and `FakeTutor` are shared with test_browser_lessons.py.
"""

from __future__ import annotations

import json
import mimetypes
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import jinja2
import pytest
from playwright.sync_api import Page, WebSocketRoute, sync_playwright

from typewriter.server.app import SECURITY_HEADERS

pytestmark = [pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
ORIGIN = "http://localhost:8765"  # never listened on: every request is answered by the route below
SETTINGS = {"protocol": 1, "ws_path": "/ws", "max_new_tokens": 256, "max_new_tokens_cap": 1024,
            "max_message_bytes": 65536, "max_messages": 64}
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 860}
MIME = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
        ".woff2": "font/woff2", ".woff": "font/woff", ".ttf": "font/ttf", ".html": "text/html"}

LONG_ANSWER = """Here is a loop, a link and a table.

```python
numbers = [1, 2, 3]; total = sum(n * n for n in numbers if n % 2 == 1) + sum(n for n in numbers if n % 2 == 0) + 1000000  # a long line
print(total)
```

See https://example.org/a/very/long/path/that/goes/on/and/on/without/any/break/at/all/index.html?query=photosynthesis&page=1 for more.

Pneumonoultramicroscopicsilicovolcanoconiosisisaverylongwordthatneverbreaksanywhereatall is a long word.

| Element | Symbol | Atomic number | Atomic mass | Group | Period | Discovered by | Year of discovery |
|---|---|---:|---:|---|---|---|---|
| Hydrogen | H | 1 | 1.008 | 1 | 1 | Henry Cavendish | 1766 |
| Helium | He | 2 | 4.0026 | 18 | 1 | Pierre Janssen and Norman Lockyer | 1868 |

- Plants
  - Leaves
    1. Chloroplasts hold chlorophyll, which absorbs mostly blue and red light and reflects green
    2. Stomata
  - Roots
- Animals
"""


def _static(path: str) -> tuple[bytes, str] | None:
    """The body and type of a file under static/ or frontend/, or None when it is not one (or tries to escape)."""
    top, _, rest = path.lstrip("/").partition("/")
    if top not in ("static", "frontend") or not rest:
        return None
    base = (ROOT / top).resolve()
    file = (base / rest).resolve()
    if base not in file.parents or not file.is_file():
        return None
    return file.read_bytes(), MIME.get(file.suffix) or mimetypes.guess_type(file.name)[0] or "application/octet-stream"


def _index() -> bytes:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "templates"), autoescape=True)
    return env.get_template("index.html").render(config=SETTINGS).encode()


def _serve(route) -> None:
    path = route.request.url.removeprefix(ORIGIN).split("?")[0]
    headers = {k.decode(): v.decode() for k, v in SECURITY_HEADERS}
    if path == "/":
        route.fulfill(status=200, body=_index(), headers=headers | {"content-type": "text/html; charset=utf-8"})
    elif path == "/readyz":  # the page asks before it opens its socket
        route.fulfill(status=200, body=json.dumps({"status": "ready"}),
                      headers=headers | {"content-type": "application/json"})
    elif found := _static(path):
        body, kind = found
        route.fulfill(status=200, body=body, headers=headers | {"content-type": kind})
    else:
        route.fulfill(status=404, body=b"not found", headers=headers | {"content-type": "text/plain"})


class FakeTutor:
    """The server's side of the page's socket. Each chat frame is recorded; `reply(frame)` gives the frames to
    send back at once (by default: start, the answer in small tokens, end). A test that wants to stream by hand
    sets `reply` to return [] and calls `send` itself."""

    def __init__(self) -> None:
        self.chats: list[dict] = []
        self.stops: list[str] = []
        self.answer = "Hello!"
        self.dropped = 0
        self.reply: Callable[[dict], list[dict]] = self.whole_answer
        self.socket: WebSocketRoute | None = None

    def attach(self, ws: WebSocketRoute) -> None:
        self.socket = ws
        ws.on_message(self._on_message)

    def _on_message(self, message: str | bytes) -> None:
        frame = json.loads(message)
        if frame.get("type") == "chat":
            self.chats.append(frame)
            for out in self.reply(frame):
                self.send(out)
        elif frame.get("type") == "stop":
            self.stops.append(frame["id"])
            self.send(end(frame["id"], "cancelled"))
        elif frame.get("type") == "ping":
            self.send({"type": "pong"})

    def send(self, frame: dict) -> None:
        assert self.socket is not None, "the page has not opened its socket"
        self.socket.send(json.dumps(frame))

    def whole_answer(self, frame: dict) -> list[dict]:
        rid = frame["id"]
        pieces = [self.answer[i:i + 7] for i in range(0, len(self.answer), 7)]
        return [start(rid, self.dropped), *(token(rid, i, p) for i, p in enumerate(pieces)), end(rid)]


def start(rid: str, dropped: int = 0) -> dict:
    return {"type": "start", "id": rid, "prompt_tokens": 12, "cached_tokens": 0, "dropped_messages": dropped}


def token(rid: str, index: int, text: str) -> dict:
    return {"type": "token", "id": rid, "index": index, "text": text}


def end(rid: str, reason: str = "eos") -> dict:
    return {"type": "end", "id": rid, "reason": reason, "usage": {"prompt_tokens": 12, "completion_tokens": 30},
            "timings": {"queue_ms": 0, "ttft_ms": 80, "total_ms": 900, "tokens_per_s": 33.3}}


@pytest.fixture(scope="module")  # one Playwright at a time: each module (and test_browser.py) starts its own
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@contextmanager
def open_page(browser, viewport: dict, scheme: str = "light", path: str = "/",
              **context_options) -> Iterator[tuple[Page, FakeTutor, list[str]]]:
    """A fresh browser context on the page at `path` (such as "/?dev=1"), connected to a FakeTutor. The list
    collects page errors, console errors and CSP violations; it must be empty when the block ends."""
    context = browser.new_context(viewport=viewport, color_scheme=scheme, has_touch=viewport["width"] < 500,
                                  is_mobile=viewport["width"] < 500, **context_options)
    tutor = FakeTutor()
    errors: list[str] = []
    try:
        context.route(f"{ORIGIN}/**", _serve)
        # A CSP violation is an event in the page (and a console error); the init script runs before the page's.
        context.add_init_script(CSP_WATCH)
        page = context.new_page()
        page.route_web_socket("**/ws", tutor.attach)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.goto(ORIGIN + path)
        page.wait_for_selector("#status[data-state=ok]", timeout=10_000)
        yield page, tutor, errors
        errors += [f"CSP violation: {v}" for v in csp_violations(page)]
        assert not errors, errors
    finally:
        context.close()


CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation",
    (e) => window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || "inline"} (${e.sample})`));
"""


def csp_violations(page: Page) -> list[str]:
    return page.evaluate("() => window.__cspViolations")


def ask(page: Page, question: str) -> None:
    page.fill("#question", question)
    page.keyboard.press("Enter")


def wait_done(page: Page) -> None:
    page.wait_for_selector(".turn:last-child .tutor[aria-busy=false]", timeout=10_000)


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


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
