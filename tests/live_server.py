"""The app under real uvicorn on a loopback socket, on a thread of the test process: what only a real server
shows (close codes, HTTP over a socket, a page in a real browser), without a model when the engine is scripted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from typewriter.config import Settings
from typewriter.server.app import create_app
from typewriter.server.main import Server, uvicorn_config

TEST_SETTINGS = dict(port=0, system_prompt="Be brief.", max_new_tokens=16, max_new_tokens_cap=64,
                     max_message_bytes=4096, ping_interval_s=5.0, ping_timeout_s=5.0, shutdown_grace_s=2.0)


@contextmanager
def running(engine_factory, ready: bool = True, **overrides) -> Iterator[tuple[Server, str]]:
    """Serve the app over `engine_factory` (scripted.factory(engine)); yield the server and "127.0.0.1:PORT" once
    it listens, and, with `ready`, once the model has loaded. Stops it on the way out."""
    settings = Settings.of(**{**TEST_SETTINGS, **overrides})
    app = create_app(settings, engine_factory)
    server = Server(uvicorn_config(app, settings, host="127.0.0.1", log_level="warning"), app.state.server)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not (server.started and (app.state.server.ready or not ready)):
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield server, f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
