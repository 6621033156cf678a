"""What int8-lite's slot sizing reads of the machine: which CPU it is, the memory free for the caches, and how busy
other processes keep it while the step times are measured. Linux's /proc; elsewhere each is unknown."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_signature() -> str:
    """What the step times depend on besides the model: the CPU's name, its flags and how many it has."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    return f"{name}|{os.cpu_count()}|{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class OthersBusy:
    """Other processes' share of the machine's CPU time from its making to `share`: every CPU's busy time (a
    virtual machine's stolen time counted busy, as the host took it) less this process's own."""

    def __init__(self) -> None:
        self._at = self._sample()

    def share(self) -> float | None:
        """0 (only this process ran) to 1 (others kept every CPU busy); None where /proc/stat cannot be read."""
        now = self._sample()
        if self._at is None or now is None:
            return None
        (busy0, own0, wall0), (busy1, own1, wall1) = self._at, now
        capacity = (wall1 - wall0) * (os.cpu_count() or 1)
        if capacity <= 0:
            return None
        return min(1.0, max(0.0, ((busy1 - busy0) - (own1 - own0)) / capacity))

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        except (OSError, ValueError):
            return None
        if len(fields) < 8:
            return None
        idle = fields[3] + fields[4]  # idle and iowait; guest time is already in user's
        times = os.times()
        return (sum(fields) - idle) / CLOCK_TICKS, times.user + times.system, time.monotonic()
