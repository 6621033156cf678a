"""uvicorn's access log without the health probes, asked every second or two, whose lines would bury the ones
worth reading; `--log-level debug` keeps them."""

from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"
PROBES = frozenset({"/healthz", "/readyz"})


class ProbeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args  # uvicorn's: (client address, method, path with query, HTTP version, status)
        if isinstance(args, tuple) and len(args) == 5 and str(args[2]).partition("?")[0] in PROBES:
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_probes() -> None:
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, ProbeFilter) for f in logger.filters):
        logger.addFilter(ProbeFilter())
