"""timeline.py [MODEL]: launch `typewriter serve` (PYTHONPATH=backend, from a clone's root), print each log line with
the seconds since launch, and READY once /readyz answers 200 (polled every 20 ms); then stop it."""

import os
import subprocess
import sys
import threading
import time

import httpx

PORT = 18231


def main() -> None:
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", "127.0.0.1", "--port", str(PORT)]
    if len(sys.argv) > 1:
        argv += ["--model", sys.argv[1]]
    t0 = time.perf_counter()
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def echo() -> None:
        assert server.stderr is not None
        for line in server.stderr:
            print(f"{time.perf_counter() - t0:6.2f} {line.rstrip()[:150]}", flush=True)

    threading.Thread(target=echo, daemon=True).start()
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    print(f"{time.perf_counter() - t0:6.2f} READY")
    server.terminate()
    server.wait()


if __name__ == "__main__":
    main()
