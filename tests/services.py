"""Debian's prometheus and nginx as child processes of a test, each in its own temp dir on a free loopback port,
and a client that keeps one socket chatting, for the `services` tests (e2e/test_monitoring.py, e2e/test_scale_out.py).

scripts/install-services.sh installs both packages; their system services are never used. Each process runs in
the foreground, logs to a file in its folder, and is stopped (SIGTERM, then SIGKILL) on the way out, whatever
happened inside the `with`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from real_server import http_get
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
CONF = Path(__file__).resolve().parents[1] / "deploy" / "nginx" / "typewriter.conf"
HASH = "hash $conversation_key consistent;"


def binary(name: str, path: str) -> str:
    """The package's binary, or a failure saying how to get it (a marker selects these tests, never a skip)."""
    found = shutil.which(name) or (path if os.access(path, os.X_OK) else None)
    if found is None:
        pytest.fail(f"{path} is missing: run scripts/install-services.sh (Debian's prometheus and nginx)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(base: str, name: str) -> float:
    """The sum of every sample of `name` (labels included) on a server's /metrics."""
    status, text = http_get(f"{base}/metrics")
    assert status == 200, text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


@contextmanager
def child(argv: list[str], log_path: Path, ready_url: str) -> Iterator[subprocess.Popen]:
    """Run `argv` until the `with` ends; yield once `ready_url` answers 200."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{argv[0]} exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if http_get(ready_url, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{argv[0]} did not answer {ready_url}:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def prometheus(config: str, folder: Path) -> Iterator[str]:
    """Debian's prometheus with `config` (YAML text), its storage in `folder`; yields its base URL."""
    exe = binary("prometheus", "/usr/bin/prometheus")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(config)
    base = f"http://127.0.0.1:{free_port()}"
    argv = [exe, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address={base.removeprefix('http://')}", "--log.level=warn"]
    with child(argv, folder / "prometheus.log", f"{base}/-/ready"):
        yield base


def nginx_main_conf(prefix: Path, include: Path) -> str:
    """A whole nginx.conf around one http{} include, with every path in `prefix` (nothing of /etc/nginx)."""
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers as root can read the test's private temp dir
    temp = "\n".join(f"  {kind}_temp_path {prefix / 'temp' / kind};" for kind in
                     ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (f"{user}worker_processes 1;\npid {prefix / 'nginx.pid'};\nerror_log {prefix / 'error.log'} info;\n"
            "events { worker_connections 1024; }\n"
            f"http {{\n  access_log {prefix / 'access.log'};\n{temp}\n  include {include};\n}}\n")


@contextmanager
def nginx(server_conf: str, prefix: Path, ready_path: str = "/readyz") -> Iterator[str]:
    """Debian's nginx, not daemonised, serving `server_conf` (an http{} include such as deploy/nginx's, its
    `listen` already on a loopback port); yields its base URL once `ready_path` answers 200 through it."""
    exe = binary("nginx", "/usr/sbin/nginx")
    (prefix / "temp").mkdir(parents=True, exist_ok=True)
    (prefix / "typewriter.conf").write_text(server_conf)
    (prefix / "nginx.conf").write_text(nginx_main_conf(prefix, prefix / "typewriter.conf"))
    listen = next(line.split()[1].rstrip(";") for line in server_conf.splitlines()
                  if line.strip().startswith("listen "))
    base = f"http://{listen}"
    argv = [exe, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-e", str(prefix / "error.log"),
            "-g", "daemon off;"]
    check = subprocess.run([*argv[:-2], "-t"], capture_output=True, text=True)
    assert check.returncode == 0, f"nginx -t refused the configuration:\n{check.stderr}"
    with child(argv, prefix / "stdout.log", f"{base}{ready_path}"):
        yield base


def local_conf(listen_port: int, replicas: list[str], read_timeout_s: int | None = None) -> str:
    """deploy/nginx/typewriter.conf with only its addresses changed (the listening port and the upstream servers),
    and with `read_timeout_s` its proxy_read_timeout."""
    text = CONF.read_text()
    servers = re.findall(r"^( +)server (\S+:\d+)( [^;]*)?;$", text, re.M)
    assert servers, "no upstream servers in typewriter.conf"
    indent, _, options = servers[0]
    lines = "\n".join(f"{indent}server {address}{options};" for address in replicas)
    text = re.sub(r"^ +server \S+:\d+( [^;]*)?;\n", "", text, flags=re.M)
    text = text.replace(HASH + "\n", f"{HASH}\n{lines}\n", 1)
    if read_timeout_s is not None:
        text, n = re.subn(r"proxy_read_timeout \d+s;", f"proxy_read_timeout {read_timeout_s}s;", text)
        assert n == 1, "no proxy_read_timeout in typewriter.conf"
    return text.replace("listen 80", f"listen 127.0.0.1:{listen_port}")


@dataclass
class ChatLoop:
    """One socket that sends chat after chat, each read to its terminal frame, until told to stop or until the
    server closes the socket. `chats` holds each chat's frames; `close_code` how the socket ended."""

    url: str
    name: str
    params: dict = field(default_factory=lambda: {"max_new_tokens": 32})
    pause_s: float = 0.0  # between one chat's end and the next
    chats: list[list[dict]] = field(default_factory=list)
    close_code: int | None = None
    error: BaseException | None = None
    opened: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ChatLoop:
        self._thread = threading.Thread(target=self._run, name=f"chat-{self.name}", daemon=True)
        self._thread.start()
        if not self.opened.wait(15):
            raise AssertionError(f"{self.name}: the socket did not open: {self.error!r}")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self.join(timeout)

    def join(self, timeout: float = 30.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.name}: still chatting after {timeout:.0f} s"
        if self.error is not None:
            raise AssertionError(f"{self.name} failed") from self.error

    def _run(self) -> None:
        try:
            with connect(self.url, open_timeout=10) as ws:
                self.opened.set()
                n = 0
                while not self._stop.is_set():
                    n += 1
                    frames: list[dict] = []
                    self.chats.append(frames)
                    ws.send(json.dumps({"type": "chat", "id": f"{self.name}-{n}",
                                        "messages": [{"role": "user", "content": f"question {n}"}],
                                        "params": self.params}))
                    while not frames or frames[-1]["type"] not in ("end", "error"):
                        frames.append(json.loads(ws.recv(timeout=30)))
                    self._stop.wait(self.pause_s)
        except ConnectionClosed as e:
            self.close_code = e.rcvd.code if e.rcvd else None
        except BaseException as e:  # reported by join
            self.error = e
        finally:
            self.opened.set()
            if self.chats and not self.chats[-1]:
                self.chats.pop()  # sent into a closing socket: never a chat
