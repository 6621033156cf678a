"""uvicorn's access log without the health probes, asked every second or two, whose lines would bury the ones
worth reading (`--log-level debug` keeps them), and without the class codes pages join by: a log is read by
more people than a class's code is meant for."""

from __future__ import annotations

import logging
import re

ACCESS_LOGGER = "uvicorn.access"
PROBES = frozenset({"/healthz", "/readyz"})
CLASS_CODE = re.compile(r"([?&]class=)[^&#]*")


class ProbeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args  # uvicorn's: (client address, method, path with query, HTTP version, status)
        if not (isinstance(args, tuple) and len(args) == 5):
            return True
        path = str(args[2])
        if path.partition("?")[0] in PROBES:
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        if "class=" in path:
            record.args = (args[0], args[1], CLASS_CODE.sub(r"\1…", path), args[3], args[4])
        return True


def quiet_probes() -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, ProbeFilter) for f in logger.filters):
        logger.addFilter(ProbeFilter())
