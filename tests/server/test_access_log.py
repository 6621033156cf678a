"""uvicorn's access log without a line per health probe (server/access_log.py): the page asks /readyz about once
a second while the model loads, Docker and Kubernetes ask it and /healthz every few seconds, and a line for each
buried the load's progress. Other requests are still logged, and `--log-level debug` keeps the probes too."""

from __future__ import annotations

import logging
import re

import pytest
from real_server import http_get, real_server

from typewriter.server.access_log import ACCESS_LOGGER, ProbeFilter


def _access(path: str) -> logging.LogRecord:
    """A record as uvicorn's HTTP protocols make one."""
    return logging.LogRecord(ACCESS_LOGGER, logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:5000", "GET", path, "1.1", 503), None)


@pytest.fixture
def access_level():
    """Sets the access logger's level for one test (setLevel, which also clears its isEnabledFor cache)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    before = logger.level
    yield logger.setLevel
    logger.setLevel(before)


@pytest.mark.parametrize("path, kept", [("/readyz", False), ("/healthz", False), ("/readyz?x=1", False),
                                        ("/", True), ("/v1/models", True), ("/readyz/x", True)])
def test_the_probe_paths_are_dropped_and_every_other_path_is_kept(path, kept, access_level):
    access_level(logging.INFO)
    assert ProbeFilter().filter(_access(path)) is kept


@pytest.mark.parametrize("path, logged", [("/?class=ALG1-7QX2", "/?class=…"),
                                          ("/?dev=1&class=abc&x=2", "/?dev=1&class=…&x=2"), ("/?x=1", "/?x=1")])
def test_a_class_code_is_left_out_of_the_log(path, logged, access_level):
    access_level(logging.INFO)
    record = _access(path)
    assert ProbeFilter().filter(record) and record.args[2] == logged


def test_with_debug_logging_the_probes_are_kept(access_level):
    access_level(logging.DEBUG)
    assert ProbeFilter().filter(_access("/readyz"))


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_server_logs_its_load_and_its_requests_but_no_probe(tmp_path):
    log_path = tmp_path / "server.log"
    # real_server itself asks /readyz twice a second until the model is loaded
    with real_server({"TYPEWRITER_MAX_ACTIVE": "2"}, log_path) as base:
        for _ in range(5):
            assert http_get(f"{base}/readyz")[0] == 200
            assert http_get(f"{base}/healthz")[0] == 200
        assert http_get(f"{base}/")[0] == 200
    log = log_path.read_text()
    assert re.search(r"typewriter\.server: loading: .*SmolLM2-135M-Instruct", log), log
    assert "typewriter.server: ready: " in log
    assert re.search(r'"GET / HTTP/1\.1" 200', log), "the access log is off altogether"
    probes = [line for line in log.splitlines() if re.search(r'"GET /(readyz|healthz)', line)]
    assert probes == [], probes[:3]
