"""The slot count over real starts of the embedded model: a first start on a busy machine (a real load, processes
spinning on every CPU) measures slow steps, sizes few slots and says it measured under load; the next start, the
load gone, measures again and opens more, and a figure measured idle is kept for good."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import default_weights
from real_server import http_get, real_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPIN = "while True: pass"


def seeded_cache(folder: Path, model: Path) -> Path:
    """A program cache with the embedded model's programs (or blocks) in the default format copied from the user's,
    where it holds them (the test is of the probe, and making int8-lite's programs on a busy machine takes
    minutes), and no kept step times."""
    from typewriter.config import WeightFormat, lite_cache_dir
    from typewriter.runners.lite import blocks_cache
    from typewriter.runners.lite.program_cache import cache_key
    from typewriter.runners.lite.start import CAPACITY
    from typewriter.weights.source import open_source, read_config

    source, _ = open_source(model)
    cfg = read_config(source)
    fmt = WeightFormat(default_weights(model))
    key = cache_key(model, cfg, fmt.value, blocks_cache.LAYOUT if fmt is WeightFormat.Q4_BLOCKS else "")
    mine = lite_cache_dir({k: v for k, v in os.environ.items() if k != "TYPEWRITER_LITE_CACHE"})
    if mine and (made := Path(mine) / key).is_dir():
        shutil.copytree(made, folder / key, ignore=shutil.ignore_patterns(CAPACITY))
    return folder


@contextmanager
def busy_machine() -> Iterator[None]:
    """Twice as many spinning processes as CPUs, so the probe gets a small share of them whatever else runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def start(env: dict[str, str], log: Path) -> tuple[dict, str]:
    """/readyz's runtime.slots, and the start's log."""
    with real_server(env, log) as base:
        status, body = http_get(f"{base}/readyz")
        assert status == 200, body
    return json.loads(body)["runtime"]["slots"], log.read_text()


def test_a_busy_first_start_is_measured_again_at_the_next_start_and_opens_more_slots(tmp_path, embedded_model_path):
    env = {"TYPEWRITER_LITE_CACHE": str(seeded_cache(tmp_path / "lite", embedded_model_path))}
    with busy_machine():
        busy, busy_log = start(env, tmp_path / "busy.log")
    assert busy["measured_under_load"] is True and busy["sized_by"] in ("measured step time", "memory")
    assert "measured under load: other processes took" in busy_log and "so the next start measures again" in busy_log
    (kept,) = (tmp_path / "lite").glob("*/capacity.json")
    assert json.loads(kept.read_text())["others"] > 0.2

    idle, idle_log = start(env, tmp_path / "idle.log")
    assert "the kept step times were measured while other processes took" in idle_log
    assert idle["count"] > busy["count"], (busy, idle)
    assert idle["bounds"] == busy["bounds"] and idle["count"] <= idle["bounds"][1]
    if not idle["measured_under_load"]:  # the machine is shared: another's work may have kept it busy still
        again, again_log = start(env, tmp_path / "again.log")
        assert again == idle and "measuring again" not in again_log
