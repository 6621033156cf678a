"""The page in a real browser with Playwright standing in for the server, for e2e/test_browser_page.py and
e2e/test_browser_lessons.py: no model and no server process.

Playwright answers the page's requests from the repository (templates/, static/, frontend/) with the server's own
security headers, strict CSP included, and plays the server's side of the socket with protocol v1 frames
(`FakeTutor`). So each test says exactly what the tutor answers, and when. Debian's Chromium is driven headless
(the `browser` fixture: import it into a test module to use it); no browser is downloaded. Screenshots go to
artifacts/.
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

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
ORIGIN = "http://localhost:8765"  # never listened on: every request is answered by the route below
SETTINGS = {"protocol": 1, "ws_path": "/ws", "max_new_tokens": 256, "max_new_tokens_cap": 1024,
            "max_message_bytes": 65536, "max_messages": 64}
SOCKET = re.compile(r"/ws(\?.*)?$")  # the page names its open chat in the query (?conversation=), for balancers
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


@pytest.fixture(scope="module")  # one Playwright at a time: each module (and e2e/test_browser.py) starts its own
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
        page.route_web_socket(SOCKET, tutor.attach)
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
