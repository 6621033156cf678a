"""served_memory.py MODEL N TREE [CACHE]: N cached starts of `typewriter serve` from TREE (PYTHONPATH=TREE/backend,
TYPEWRITER_LITE_CACHE=CACHE if given), each asked start.py's question, then left 2 s for the idle warm-up; prints the
server's VmRSS and VmHWM in MB."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from first_text import HOST, Params, TypewriterChat, ask, start


def main() -> None:
    model, n, tree = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    for _ in range(n):
        server, port, _ = start(model, tree, sys.argv[4] if len(sys.argv) > 4 else None)
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
