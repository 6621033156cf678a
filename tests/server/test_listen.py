"""`typewriter serve` as a user starts it, as a subprocess: a port it cannot have stops it with one line and exit
code 4 before anything starts, and a bad option is named as the user typed it (server/listen.py, commands/serve.py).
Nothing here loads a model: every case stops before the loader would start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from repo import ROOT

from typewriter.server.listen import EXIT_CANNOT_LISTEN, listen


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TYPEWRITER_")}
    return subprocess.run([sys.executable, "-m", "typewriter", "serve", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=clean | (env or {}))


@contextmanager
def port_in_use() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_port_in_use_is_one_line_and_exit_code_4_without_loading_or_draining():
    with port_in_use() as port:
        run = serve("--port", str(port))
    assert run.returncode == EXIT_CANNOT_LISTEN == 4
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        f"typewriter: error: port {port} on 127.0.0.1 is already in use (another server listens there); stop it, or "
        "choose another port with --port (0 picks a free one)"]


def test_a_grpc_port_in_use_is_one_line_and_exit_code_4_too():
    with port_in_use() as port:
        run = serve("--port", "0", "--grpc-port", str(port))
    assert (run.returncode, run.stdout) == (4, "")
    assert run.stderr.splitlines() == [
        f"typewriter: error: gRPC port {port} on 127.0.0.1 is already in use (another server listens there); stop "
        "it, or choose another port with --grpc-port (0 picks a free one)"]


@pytest.mark.parametrize(("host", "said"), [
    ("nosuchhost.invalid", "cannot listen on nosuchhost.invalid: the host name does not resolve"),
    ("192.0.2.1", "cannot listen on 192.0.2.1: no network interface of this machine has that address"),
])
def test_an_address_this_machine_does_not_have_is_named(host, said):
    run = serve("--host", host, "--port", "0")
    assert run.returncode == 4 and run.stderr.startswith(f"typewriter: error: {said}")
    assert len(run.stderr.splitlines()) == 1


@pytest.mark.parametrize(("args", "env", "said"), [
    (["--port", "99999"], {}, "--port: must be a port from 0 to 65535 (0 picks a free one), got 99999"),
    ([], {"TYPEWRITER_PORT": "99999"}, "TYPEWRITER_PORT: must be a port from 0 to 65535"),
    (["--grpc-port", "70000"], {}, "--grpc-port: must be a port from 0 to 65535"),
    (["--port", "9000", "--grpc-port", "9000"], {}, "--grpc-port: must differ from the HTTP port (9000)"),
    (["--max-active", "0"], {}, "--max-active: must be at least 1, got 0"),
    ([], {"TYPEWRITER_MAX_ACTIVE": "0"}, "TYPEWRITER_MAX_ACTIVE: must be at least 1, got 0"),
    (["--max-queue", "-1"], {}, "--max-queue: must be at least 0, got -1"),
    (["--max-context", "8"], {}, "--max-context: must be at least 16, got 8"),
    (["--model-id", "my model"], {}, "--model-id: must be 1 to 128 characters without spaces"),
    ([], {"TYPEWRITER_MODEL_ID": "my model"}, "TYPEWRITER_MODEL_ID: must be 1 to 128 characters without spaces"),
])
def test_a_bad_value_is_named_as_the_user_gave_it_an_option_or_a_variable(args, env, said):
    run = serve(*args, env=env)
    assert run.returncode == 2 and run.stderr.startswith(f"typewriter: error: {said}"), run.stderr
    assert len(run.stderr.splitlines()) == 1


def test_an_option_wins_over_a_bad_variable_which_is_then_not_an_error(monkeypatch):
    from typewriter import cli
    from typewriter.commands.serve import settings_from_args

    monkeypatch.setenv("TYPEWRITER_PORT", "99999")
    assert settings_from_args(cli.build_parser().parse_args(["serve", "--port", "8001"])).serving.port == 8001


def test_the_sockets_are_bound_before_the_server_starts_and_port_0_is_one_port_for_every_address():
    sockets = listen("localhost", 0)
    try:
        ports = {s.getsockname()[1] for s in sockets}
        assert len(ports) == 1 and ports != {0}
    finally:
        for s in sockets:
            s.close()
