"""`python tests/scripted_server.py '{"setting": value, ...}'`: the server `typewriter serve` runs (server/main.py),
over a real Engine on the scripted runner, in a process of its own: for tests that need what only a process has
to itself, such as its file descriptor limit, without loading a model. It prints `Typewriter on http://HOST:PORT/`
once bound and stops on SIGINT, as `typewriter serve` does."""

from __future__ import annotations

import json
import sys

from scripted import factory, script_engine

from typewriter.config import Settings
from typewriter.server.main import serve

if __name__ == "__main__":
    settings = Settings.of(**{"port": 0, "log_level": "warning", **json.loads(sys.argv[1])})
    sys.exit(serve(settings, factory(script_engine())))
