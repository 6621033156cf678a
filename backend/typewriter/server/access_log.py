"""uvicorn's access log without a line per health probe: /readyz and /healthz are asked every second or two (by
the page while the model loads, Docker's health check, Kubernetes, a balancer), and a line for each buried the
load's progress and every request worth reading. With `--log-level debug` they are kept."""

from __future__ import annotations

import logging

ACCESS_LOGGER = "uvicorn.access"
PROBES = frozenset({"/healthz", "/readyz"})


class ProbeFilter(logging.Filter):
    """Drops uvicorn's access records of a probe path, unless its logger takes debug records."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args  # uvicorn's: (client address, method, path with query, HTTP version, status)
        if isinstance(args, tuple) and len(args) == 5 and str(args[2]).partition("?")[0] in PROBES:
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_probes() -> None:
    """Filter the probes out of uvicorn's access log (once, however often a server is configured)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, ProbeFilter) for f in logger.filters):
        logger.addFilter(ProbeFilter())
