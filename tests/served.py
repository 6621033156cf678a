"""`running(engine)`: live_server.running over a scripted engine, for the tests that speak to a real server over
real sockets (close codes, headers, timeouts) and read its engine directly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import live_server
from scripted import factory

from typewriter.server.main import Server


@contextmanager
def running(engine, **overrides) -> Iterator[tuple[Server, str]]:
    """(the uvicorn Server, "127.0.0.1:PORT") once the app over `engine` is ready; stopped on the way out."""
    with live_server.running(factory(engine), **overrides) as served:
        yield served
