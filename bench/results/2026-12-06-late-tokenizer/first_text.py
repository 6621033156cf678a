"""first_text.py MODEL N [TREE [CACHE]]: N cached starts of `typewriter serve` from TREE (default: the current folder;
PYTHONPATH=TREE/backend, TYPEWRITER_LITE_CACHE=CACHE if given), each asked start.py's question over the socket the
moment /readyz answers 200 (polled every 20 ms); prints ready, first text and the gap between them, in seconds."""

import os
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
from classroom_clients import Params, TypewriterChat
from classroom_servers import HOST, free_port
from start import ask


def start(model: str, tree: str, cache: str | None) -> tuple[subprocess.Popen[bytes], int, float]:
    """`typewriter serve` from `tree` with 8 slots, once /readyz answers 200: the process, its port and the seconds
    from launch."""
    env = {**os.environ, "PYTHONPATH": f"{tree}/backend"} | ({"TYPEWRITER_LITE_CACHE": cache} if cache else {})
    port = free_port()
    began = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port),
                               "--max-active", "8", "--max-context", "2048", "--model", model], cwd=tree, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            if httpx.get(f"http://{HOST}:{port}/readyz", timeout=2).status_code == 200:
                return server, port, time.perf_counter() - began
        except httpx.HTTPError:
            pass
        time.sleep(0.02)


def main() -> None:
    model, n = sys.argv[1], int(sys.argv[2])
    tree = sys.argv[3] if len(sys.argv) > 3 else os.getcwd()
    for _ in range(n):
        server, port, ready = start(model, tree, sys.argv[4] if len(sys.argv) > 4 else None)
        first = ready + ask(TypewriterChat(f"ws://{HOST}:{port}/ws", Params(32, 60)))
        print(f"ready {ready:.2f} first {first:.2f} gap {first - ready:.2f}", flush=True)
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
