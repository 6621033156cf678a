"""Remake docs/images/page.png, the README's picture of the page as a student sees it: a real `typewriter serve`
with the embedded model, one question and its answer, in Debian's headless Chromium at 1280x800 (Playwright drives
/usr/bin/chromium, scripts/install-chromium.sh; no browser is downloaded). No developer figures: a fresh browser
profile without `?dev=1`.

    .venv/bin/python scripts/screenshot-page.py                      # writes docs/images/page.png
    .venv/bin/python scripts/screenshot-page.py --out /tmp/page.png --question "What is a prime number?"

The answer is sampled, so each run's words differ; the server's settings are the defaults `make run` has.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1280, "height": 800}
QUESTION = "In two or three sentences, what is photosynthesis?"
READY_TIMEOUT_S = 600  # a first start makes int8-lite's programs: seconds, or minutes on a busy machine
ANSWER_TIMEOUT_S = 120
BOUND = re.compile(r"Typewriter on (http://\S+?)/? ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "page.png")
    parser.add_argument("--question", default=QUESTION)
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing: run scripts/install-chromium.sh")
    with tempfile.TemporaryDirectory(prefix="typewriter-screenshot-") as folder:
        log_path = Path(folder) / "server.log"
        with open(log_path, "w") as log:
            server = subprocess.Popen([sys.executable, "-m", "typewriter", "serve", "--port", "0"], cwd=ROOT,
                                      stdout=log, stderr=subprocess.STDOUT)
        try:
            base = wait_until_ready(server, log_path)
            shoot(base, args.question, args.out)
        finally:
            server.send_signal(signal.SIGINT)  # drains and exits, as Ctrl-C would
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    print(args.out)
    return 0


def wait_until_ready(server: subprocess.Popen, log_path: Path) -> str:
    """The server's base URL once /readyz answers 200; exits with its log if it stops first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    base = None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
        if base is None and (bound := BOUND.search(log_path.read_text())):
            base = bound.group(1)
        if base is not None:
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
                    if response.status == 200:
                        return base
            except (urllib.error.URLError, OSError):
                pass  # 503 while loading, or not answering yet
        time.sleep(0.5)
    sys.exit(f"the server was not ready after {READY_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")


def shoot(base: str, question: str, out: Path) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_context(viewport=VIEWPORT, color_scheme="light", device_scale_factor=1).new_page()
            page.goto(f"{base}/")
            page.wait_for_selector("#status[data-state=ok]", timeout=30_000)
            page.fill("#question", question)
            page.keyboard.press("Enter")
            page.wait_for_selector(".turn:last-child .tutor[aria-busy=false]", timeout=ANSWER_TIMEOUT_S * 1000)
            page.wait_for_function("() => document.getElementById('status').textContent.startsWith('Connected')")
            if page.locator(".stats").evaluate_all("spans => spans.some(s => s.textContent.trim())"):
                sys.exit("the page shows developer figures: this is not what a student sees")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
        finally:
            browser.close()


if __name__ == "__main__":
    sys.exit(main())
