"""A real server in this process: uvicorn on a free loopback port, configured as `typewriter serve` configures it
(server/main.py), over a real Engine on the scripted runner. Tests speak to it over real sockets (close codes,
headers, timeouts) within a second of starting, and can read the engine and the app's state directly."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from scripted import factory

from typewriter.config import Settings
from typewriter.server.app import create_app
from typewriter.server.main import Server, uvicorn_config


@contextmanager
def running(engine, **overrides) -> Iterator[tuple[Server, str]]:
    """(the uvicorn Server, "127.0.0.1:PORT") once the app is ready; stopped on the way out."""
    values = dict(port=0, system_prompt="Be brief.", max_new_tokens=16, max_new_tokens_cap=64,
                  max_message_bytes=4096, ping_interval_s=5.0, ping_timeout_s=5.0, shutdown_grace_s=2.0)
    settings = Settings(**{**values, **overrides})
    app = create_app(settings, factory(engine))
    config = uvicorn_config(app, settings, host="127.0.0.1", log_level="warning")
    server = Server(config, app.state.server)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not (server.started and app.state.server.ready):
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
