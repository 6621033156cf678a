"""`typewriter loadtest` as a user runs it, a subprocess, against a real uvicorn server with a scripted engine: both
doors with their report, base URLs that name a door, and a named error with a non-zero exit for every URL that
leads nowhere (nothing listens, no such host, not a Typewriter server) or a server whose chats fail."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import wait_until
from live_server import running
from repo import ROOT
from scripted import factory, script_engine

from typewriter.commands.loadtest import percentile


def loadtest(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "typewriter", "loadtest", "--url", url, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def report_of(run: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in run.stderr, run.stderr
    return json.loads(run.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scripted_server():
    return running(factory(script_engine(["t"] * 10, step_s=0.01, slots=2, max_queue=8)))


@pytest.mark.parametrize(("door", "given", "driven", "reason"), [
    ("socket", "ws://{}/ws", "ws://{}/ws", "eos"),
    ("socket", "ws://{}", "ws://{}/ws", "eos"),  # a base URL names its door's path
    ("openai", "http://{}/v1", "http://{}/v1", "stop"),
    ("openai", "http://{}", "http://{}/v1", "stop"),
    ("openai", "http://{}/v1/chat/completions", "http://{}/v1", "stop"),  # the endpoint, pasted
])
def test_both_doors_report_latency_percentiles_and_throughput(door, given, driven, reason):
    with scripted_server() as (_, address):
        run = loadtest(given.format(address), "--concurrency", "3", "--requests", "7", "--max-new-tokens", "16",
                       "--json")
    report = report_of(run)
    assert run.returncode == 0, run.stderr
    assert report["url"] == driven.format(address)
    assert (report["ok"], report["errors"], report["reasons"]) == (7, {}, {reason: 7})
    assert report["completion_tokens"] == 77  # 10 pieces and the eos, 7 times
    assert report["ttft_ms"]["p50"] <= report["ttft_ms"]["p95"]
    assert 0 < report["inter_token_ms"]["p50"] <= report["inter_token_ms"]["p95"]
    assert report["tokens_per_s"] > 0


def test_the_table_counts_the_connections_it_opened():
    with scripted_server() as (_, address):
        run = loadtest(f"ws://{address}", "--requests", "1", "--max-new-tokens", "16")
    assert run.returncode == 0 and "1 of 1 ended (eos 1) over 1 connections" in run.stdout


@pytest.mark.parametrize("scheme", ["ws", "http"])
def test_a_server_that_is_not_running_is_a_named_error_and_exit_2(scheme):
    port = free_port()
    run = loadtest(f"{scheme}://127.0.0.1:{port}", "--requests", "1")
    door = "/ws" if scheme == "ws" else "/v1"
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (f"typewriter: error: unreachable: cannot connect to {scheme}://127.0.0.1:{port}{door}: "
                          f"connection refused: nothing listens on port {port} of 127.0.0.1; is the server running "
                          "on this port?\n")


def test_a_host_that_does_not_resolve_is_a_named_error():
    run = loadtest("http://nosuchhost.invalid:8000", "--requests", "1")
    assert run.returncode == 2 and run.stderr.startswith(
        "typewriter: error: unreachable: cannot connect to http://nosuchhost.invalid:8000/v1: the host name "
        "'nosuchhost.invalid' does not resolve")


def test_an_http_server_that_is_not_typewriter_is_a_named_error():
    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(b"<h1>Not Found</h1>")

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        run = loadtest(f"http://127.0.0.1:{other.server_port}", "--requests", "1")
    finally:
        other.shutdown()
        other.server_close()
    base = f"http://127.0.0.1:{other.server_port}/v1"
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (f"typewriter: error: unreachable: {base}/models answered HTTP 404, so {base} is no "
                          "Typewriter server's OpenAI API; give http://HOST:PORT/v1 (or ws://HOST:PORT/ws for the "
                          "socket)\n")


@pytest.mark.parametrize(("url", "said"), [
    ("http://h:8000/ws", "'http://h:8000/ws' names neither door: give ws://h:8000/ws for the socket or "
                         "http://h:8000/v1 for the OpenAI API"),
    ("ws://h:8000/v1", "'ws://h:8000/v1' names neither door"),
    ("h:8000/ws", "must be a ws:// URL such as ws://127.0.0.1:8000/ws or an http:// URL"),
])
def test_a_url_that_names_no_door_says_what_to_type(url, said):
    run = loadtest(url)
    assert run.returncode == 2 and f"argument --url: {said}" in run.stderr


@pytest.mark.parametrize(("scheme", "code"), [("ws", "closed 1013"), ("http", "loading")])
def test_chats_a_loading_server_turns_away_are_reported_and_exit_1(scheme, code):
    gate = threading.Event()
    with running(factory(script_engine(), gate), ready=False) as (server, address):
        try:
            run = loadtest(f"{scheme}://{address}", "--requests", "2", "--max-new-tokens", "16", "--json")
        finally:
            gate.set()  # the load ends while the server runs
        wait_until(lambda: server.state.ready, "the model loaded")
    report = report_of(run)
    assert run.returncode == 1
    assert (report["ok"], report["errors"]) == (0, {code: 2})
    assert "loading" in report["error_messages"][code]


def test_percentile_is_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 0.0)) == (3.0, 5.0, 1.0)
