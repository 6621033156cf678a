"""`python -m typewriter serve` as a subprocess, for end-to-end tests against the real model.

The server binds a free port (`--port 0`) and prints `Typewriter on http://HOST:PORT/` once bound, so there is
no window in which another process can take the port (with `--grpc-port 0` in `args`, `grpc_address` reads the
`gRPC on HOST:PORT` line likewise). `real_server` waits for /readyz to answer 200, fails at
once with the server's log if the process exits first, and stops it with SIGINT (as Ctrl-C would) on the way
out, failing if it does not exit cleanly.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 600.0  # loading and compiling the model cold on a small CPU takes minutes
STOP_TIMEOUT_S = 30.0
CLEAN_EXIT = 0  # after SIGINT or SIGTERM the server drains and exits 0
_BOUND = re.compile(r"Typewriter on (http://\S+?)/? ")
_GRPC_BOUND = re.compile(r"^gRPC on (\S+)$", re.M)
_POLL = re.compile(r'"GET /(readyz|metrics) HTTP')
_NATIVE_ERROR = re.compile(r"^[EF]\d{4} \d\d:\d\d:.*$", re.M)  # absl's ERROR and FATAL lines (TensorFlow, XLA)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


@contextmanager
def real_server(env: Mapping[str, str], log_path: Path, ready_timeout_s: float = READY_TIMEOUT_S,
                args: Sequence[str] = ()) -> Iterator[str]:
    """Start the server with `env` over this process's environment and `args` after `serve --port 0`; yield its
    base URL once it is ready. Its stdout and stderr go to `log_path`."""
    with server_process(env, log_path, ready_timeout_s, args) as (_, base):
        yield base


@contextmanager
def server_process(env: Mapping[str, str], log_path: Path, ready_timeout_s: float = READY_TIMEOUT_S,
                   args: Sequence[str] = ()) -> Iterator[tuple[subprocess.Popen, str]]:
    """As real_server, but yields the process too (a test may signal it); stops it if it still runs."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEWRITER_TEST_")}  # not settings
    child_env |= {"PYTHONUNBUFFERED": "1", **env}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "typewriter", "serve", "--port", "0", *args],
                                cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc, _wait_until_ready(proc, log_path, ready_timeout_s)
    except BaseException:
        _stop(proc, log_path, check=False)  # the failure that got here is the one to report
        raise
    _stop(proc, log_path, check=True)


def grpc_address(log_path: Path) -> str:
    """HOST:PORT from the `gRPC on` line of a server started with `--grpc-port` (printed before it is ready)."""
    bound = _GRPC_BOUND.search(log_path.read_text())
    if bound is None:
        pytest.fail(f"the server printed no 'gRPC on' line:\n{_tail(log_path)}")
    return bound.group(1)


def _wait_until_ready(proc: subprocess.Popen, log_path: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    base = None
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited with {proc.returncode} before it was ready:\n{_tail(log_path)}")
        if base is None and (bound := _BOUND.search(log_path.read_text())):
            base = bound.group(1)
        if base is not None:
            try:
                if http_get(f"{base}/readyz")[0] == 200:
                    return base
            except OSError:
                pass  # bound, but not answering yet
        if time.monotonic() > deadline:
            pytest.fail(f"the server was not ready after {timeout_s:.0f} s:\n{_tail(log_path)}")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen, log_path: Path, check: bool) -> None:
    if check and proc.poll() not in (None, CLEAN_EXIT):
        pytest.fail(f"the server died while in use, with {proc.returncode}:\n{_tail(log_path)}")
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            if check:
                pytest.fail(f"the server did not stop within {STOP_TIMEOUT_S:.0f} s of SIGINT:\n{_tail(log_path)}")
    if check and proc.returncode != CLEAN_EXIT:
        pytest.fail(f"the server exited with {proc.returncode} after SIGINT:\n{_tail(log_path)}")
    if check and (errors := _NATIVE_ERROR.findall(log_path.read_text(errors="replace"))):
        pytest.fail(f"a normal run logged {len(errors)} native error lines, the first: {errors[0][:300]}")


def _tail(log_path: Path, chars: int = 4000) -> str:
    """The end of the log, without the access lines of polling (which would crowd out the reason)."""
    lines = log_path.read_text(errors="replace").splitlines(keepends=True)
    return "".join(line for line in lines if not _POLL.search(line))[-chars:]
