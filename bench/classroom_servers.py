"""The classroom benchmark's servers: started on loopback, waited for until ready, stopped, their logs kept.

`typewriter serve` is ready when GET /readyz answers 200 (once its first XLA programs compile; the rest follow in
the background); llama-server when GET /health does. Each writes its log to a file whose tail is shown if it fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """A child process serving on HOST:port, ready once `ready_path` answers 200."""

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str, env: dict[str, str] | None = None):
        self.name, self.argv, self.port, self.ready_path = name, argv, port, ready_path
        self.env = None if env is None else {**os.environ, **env}
        self.log = Path(tempfile.mkstemp(prefix=f"classroom-{name}-", suffix=".log")[1])
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout_s: float, poll_s: float = 1.0) -> Server:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} before it was ready:\n"
                                   f"{self.log_tail()}")
            try:
                if httpx.get(self.http_url + self.ready_path, timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        self.stop()
        raise RuntimeError(f"{self.name} was not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGINT, as Ctrl-C would, then SIGKILL if it has not exited within 30 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def status(self, field: str) -> int:
        """A field of /proc/<pid>/status in kB (VmRSS, VmHWM: the peak)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def typewriter_server(max_active: int | None, max_queue: int, max_context: int, model: str | None) -> Server:
    """`max_active` None: the slots the server sizes itself (its default)."""
    port = free_port()
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port),
            "--max-queue", str(max_queue), "--max-context", str(max_context)]
    if max_active:
        argv += ["--max-active", str(max_active)]
    if model:
        argv += ["--model", model]
    # every simulated student connects from loopback, and the abuse limits count per address (llama-server has
    # none, nor deadlines); the students send the tutor's system prompt themselves, as llama-server needs
    unlimited = {"TYPEWRITER_MAX_CONNECTIONS_PER_CLIENT": "100000", "TYPEWRITER_CHATS_PER_MINUTE": "100000",
                 "TYPEWRITER_REQUEST_TIMEOUT_S": "none", "TYPEWRITER_QUEUE_TIMEOUT_S": "none",
                 "TYPEWRITER_CLIENT_SYSTEM_PROMPT": "replace", "TYPEWRITER_API_SYSTEM_PROMPT": "replace"}
    return Server("typewriter", argv, port, "/readyz", unlimited)


def llama_server(binary: str, model: str, slots: int, slot_context: int, threads: int, unified: bool) -> Server:
    """`-np slots` and `-c slots * slot_context`; with `unified`, one shared KV buffer (-kvu), each slot still
    limited to `slot_context`."""
    port = free_port()
    argv = [binary, "-m", model, "--host", HOST, "--port", str(port), "-np", str(slots),
            "-c", str(slots * slot_context), "-t", str(threads)]
    if unified:
        argv += ["-kvu", "--kv-unified-per-slot", str(slot_context)]
    return Server(f"llama-server{'-kvu' if unified else ''}", argv, port, "/health")


def build_llama_server() -> str:
    """The path scripts/build-llama-server.sh prints (it builds once, then answers from its cache)."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "build-llama-server.sh")], stdout=subprocess.PIPE,
                          text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def embedded_model() -> str:
    from typewriter.weights.source import embedded_model_path

    return str(embedded_model_path())
