"""served_memory.py MODEL N TREE [CACHE]: N cached starts of `typewriter serve` from TREE (PYTHONPATH=TREE/backend,
TYPEWRITER_LITE_CACHE=CACHE if given), each asked start.py's question, then left 2 s for the idle warm-up; prints the
server's VmRSS and VmHWM in MB."""

import os
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.."))
from classroom_clients import Params, TypewriterChat
from classroom_servers import HOST, free_port
from start import ask


def main() -> None:
    model, n, tree = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    env = {**os.environ, "PYTHONPATH": f"{tree}/backend"}
    if len(sys.argv) > 4:
        env["TYPEWRITER_LITE_CACHE"] = sys.argv[4]
    for _ in range(n):
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port),
                                   "--max-active", "8", "--max-context", "2048", "--model", model], cwd=tree, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            try:
                if httpx.get(f"http://{HOST}:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        ask(TypewriterChat(f"ws://{HOST}:{port}/ws", Params(32, 60)))
        time.sleep(2.0)
        with open(f"/proc/{server.pid}/status") as status:
            mb = {line.split(":")[0]: int(line.split()[1]) // 1024 for line in status
                  if line.startswith(("VmRSS", "VmHWM"))}
        print(f"{tree} rss {mb['VmRSS']} hwm {mb['VmHWM']}", flush=True)
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
