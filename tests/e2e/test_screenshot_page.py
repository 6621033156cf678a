"""scripts/screenshot-page.py, which remakes the README's picture of the page: a real server with the embedded
model, a question and its answer, Chromium at 1280x800, and no developer figures (the script refuses to write a
picture that shows them)."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from real_server import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.browser]


def test_the_script_writes_a_1280_by_800_picture_of_a_student_page(tmp_path):
    out = tmp_path / "page.png"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "screenshot-page.py"), "--out", str(out),
                          "--question", "What is a prime number?"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1280, 800)  # IHDR: width, height
