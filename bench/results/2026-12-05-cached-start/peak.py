"""peak.py [MODEL]: the cached load in one process with 8 slots set, then the process's peak (VmHWM) and resident
(VmRSS) memory."""

import sys
import time

from typewriter import assemble
from typewriter.config import WeightFormat, lite_cache_dir
from typewriter.runners.options import RunnerOptions


def status_mb(key: str) -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith(key)).split()[1]) // 1024


def main() -> None:
    t = time.perf_counter()
    assemble.open_runner(sys.argv[1] if len(sys.argv) > 1 else None,
                         RunnerOptions(WeightFormat.AUTO, 2048, 8, lite_cache_dir(), "start"))
    print(f"open {time.perf_counter() - t:.2f}s  VmHWM {status_mb('VmHWM')} MB  VmRSS {status_mb('VmRSS')} MB")


if __name__ == "__main__":
    main()
