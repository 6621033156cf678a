"""The tutoring page in headless Chromium against a real server, for the resume tests (e2e/test_browser_resume.py,
e2e/test_resume_nginx.py); page_harness.py plays the server instead, for the page's own tests.

The page sends no sampling params, so the server's default temperature (0.2) would make every answer different;
an init script makes its chats greedy (temperature 0) by adding the param to each `chat` frame it sends, and
keeps what it sent and how many token frames came, for the test to read. Nothing else of the page is touched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from page_harness import CHROMIUM, CHROMIUM_ARGS
from playwright.sync_api import Page, sync_playwright
from websockets.sync.client import connect

ANSWER_TIMEOUT_MS = 180_000
STORAGE_KEY = "typewriter.chats.v1"  # frontend/chats.js

GREEDY = """
(() => {
  window.__sent = [];
  window.__tokens = 0;
  const Native = window.WebSocket;
  class Recording extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (event) => {
        try { if (JSON.parse(event.data).type === "token") window.__tokens++; } catch {}
      });
    }
    send(data) {
      try {
        const frame = JSON.parse(data);
        if (frame.type === "chat") {
          frame.params = { ...(frame.params || {}), temperature: 0 };
          data = JSON.stringify(frame);
        }
        window.__sent.push(frame);
      } catch {}
      return super.send(data);
    }
  }
  window.WebSocket = Recording;
})();
"""


@contextmanager
def browser_page(base: str, reduced_motion: bool = False) -> Iterator[Page]:
    """A fresh browser context (empty storage) on the page, once it says it is connected; no page errors allowed."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-chromium.sh")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1100, "height": 900},
                                      reduced_motion="reduce" if reduced_motion else "no-preference")
        context.add_init_script(GREEDY)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not _network(m.text) else None)
        page.goto(base)
        page.wait_for_selector("#status[data-state=ok]", timeout=30_000)
        try:
            yield page
        finally:
            context.close()
            browser.close()
        assert not errors, f"the page logged errors: {errors}"


def _network(text: str) -> bool:
    """Chromium's own console lines for a socket that could not connect while the network was down."""
    return "WebSocket connection to" in text or "ERR_INTERNET_DISCONNECTED" in text


def ask(page: Page, question: str) -> None:
    page.fill("#question", question)
    page.keyboard.press("Enter")


def new_chat(page: Page) -> None:
    page.click("#new-chat")


def finished(page: Page) -> None:
    """Wait until the last turn's answer has ended and its last character is on screen."""
    page.wait_for_selector(".turn:last-child .tutor[data-status=done]", timeout=ANSWER_TIMEOUT_MS)
    page.wait_for_selector(".turn:last-child .tutor[aria-busy=false]", timeout=ANSWER_TIMEOUT_MS)


def answer_text(page: Page) -> dict[str, str]:
    """The last answer as the page keeps it (saved) and as the screen shows it (rendered)."""
    saved = json.loads(page.evaluate("key => localStorage.getItem(key)", STORAGE_KEY))
    turns = next(c["turns"] for c in saved["chats"] if c["id"] == saved["current"])
    return {"saved": turns[-1]["answer"], "shown": page.locator(".turn").last.locator(".answer").inner_text()}


def tokens_received(page: Page) -> int:
    return page.evaluate("window.__tokens")


def sent_frames(page: Page) -> list[dict]:
    return page.evaluate("window.__sent")


def status_text(page: Page) -> str:
    return page.locator("#status").inner_text()


def greedy_answer(base: str, question: str) -> str:
    """The uninterrupted greedy answer to `question` as the page asks it, over a socket of its own."""
    url = base.replace("http://", "ws://", 1) + "/ws"
    with connect(url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "chat", "id": "reference", "messages": [{"role": "user", "content": question}],
                            "params": {"temperature": 0}}))
        text, deadline = "", time.monotonic() + ANSWER_TIMEOUT_MS / 1000
        while True:
            frame = json.loads(ws.recv(timeout=max(1.0, deadline - time.monotonic())))
            if frame["type"] == "token":
                text += frame["text"]
            elif frame["type"] in ("end", "error"):
                assert frame["type"] == "end" and frame["reason"] in ("eos", "length", "repetition"), frame
                return text
