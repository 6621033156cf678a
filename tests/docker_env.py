"""The Docker side of tests/e2e/test_docker.py: the engine, the images, and a Compose project on host networking.

`scripts/docker-engine.sh` makes `docker info` answer (starting Debian's dockerd if none runs) and
`scripts/docker-base-image.sh` makes the Dockerfile's base image exist (pulled, or a stand-in built from Debian's
packages where the image registry cannot be reached). A `ComposeProject` runs the repo's docker-compose.yml,
moved onto the host's network (`network_mode: host`, builds with `network: host`) so that no test traffic crosses
the Docker bridge, under a project name of its own; the server listens on loopback only, on a port of the test's
choosing. `down()` removes its containers and volumes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ENGINE_SCRIPT = ROOT / "scripts" / "docker-engine.sh"
BASE_IMAGE_SCRIPT = ROOT / "scripts" / "docker-base-image.sh"
BUILD_TIMEOUT_S = 1800.0  # TensorFlow and its dependencies, downloaded and installed cold on 2 cores
READY_TIMEOUT_S = 600.0


def sh(args: Sequence[str], timeout: float = 120.0, env: Mapping[str, str] | None = None,
       check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; its stdout and stderr are captured (text) and shown in full when `check` fails."""
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
                             f"--- stderr\n{done.stderr[-4000:]}")
    return done


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def start_engine() -> bool:
    """Make a Docker engine answer; True when this call started it (then `stop_engine()` it when done)."""
    return last_line(sh([str(ENGINE_SCRIPT)], timeout=900).stdout).startswith("started")


def stop_engine() -> None:
    sh([str(ENGINE_SCRIPT), "stop"], timeout=120)


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) where the plugin is there, else v1 (`docker-compose`, Debian's package)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0) -> int | None:
    """The status of a GET, or None while nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {})), timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        e.close()
        return e.code
    except (OSError, urllib.error.URLError):
        return None


def inspect(container: str) -> dict:
    return json.loads(sh(["docker", "inspect", container]).stdout)[0]


def logs(container: str) -> str:
    done = sh(["docker", "logs", "--tail", "60", container], check=False)
    return done.stdout + done.stderr


def image_size(image: str) -> int:
    return int(sh(["docker", "image", "inspect", "--format", "{{.Size}}", image]).stdout)


def wait_ready(url: str, container: str, since: float, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds from `since` (a time.monotonic()) until GET `url` answers 200; fails with the container's log if
    the container stops first or the time runs out."""
    while http_status(url, timeout=2.0) != 200:
        state = inspect(container)["State"]
        if not state["Running"]:
            raise AssertionError(f"the container exited with code {state['ExitCode']} before {url} answered 200:\n"
                                 f"{logs(container)}")
        if time.monotonic() - since > timeout_s:
            raise AssertionError(f"{url} did not answer 200 within {timeout_s:.0f} s:\n{logs(container)}")
        time.sleep(0.2)
    return time.monotonic() - since


def host_network_compose(path: Path, serve_image: str, dev_image: str, jupyter_port: int) -> Path:
    """docker-compose.yml as shipped, with every service and build on the host's network: published ports go
    (Compose refuses them beside `network_mode: host`), the server listens on loopback, no restart policy (a test
    wants to see an exit), no drain (a stop ends running answers at once: however fast the model writes, the stop
    test's answer is still running; tests/server time the drain itself), and JupyterLab on `jupyter_port`."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for service in compose["services"].values():
        service.pop("ports", None)
        service["network_mode"] = "host"
        if "build" in service:
            service["build"]["network"] = "host"
    serve, dev = compose["services"]["typewriter"], compose["services"]["dev"]
    serve["image"], dev["image"] = serve_image, dev_image
    serve["restart"] = "no"
    serve["environment"] |= {"TYPEWRITER_HOST": "127.0.0.1", "TYPEWRITER_DRAIN_S": "0"}
    # On the host's network the server is on loopback, not behind the name `typewriter`.
    dev["environment"]["TYPEWRITER_URL"] = "http://127.0.0.1:${TYPEWRITER_PORT}"
    dev["command"] = ["jupyter", "lab", "--ip=127.0.0.1", f"--port={jupyter_port}", "--no-browser",
                      "--ServerApp.root_dir=/app"]
    path.write_text(yaml.safe_dump(compose, sort_keys=False))
    return path


class ComposeProject:
    """A Compose file run from the repo (relative paths are the repo's) under a project name of its own, with
    variables from `env`; the server on `port` and JupyterLab on `jupyter_port`, both on the host's loopback."""

    def __init__(self, name: str, file: Path, env: Mapping[str, str], port: int, jupyter_port: int):
        self.name, self.port, self.jupyter_port = name, port, jupyter_port
        self.env = dict(env) | {"TYPEWRITER_PORT": str(port)}
        self.base = compose_command() + ["-p", name, "--project-directory", str(ROOT), "-f", str(file)]

    def __call__(self, *args: str, timeout: float = 300.0, env: Mapping[str, str] | None = None,
                 check: bool = True) -> subprocess.CompletedProcess:
        return sh(self.base + list(args), timeout=timeout, env={**self.env, **(env or {})}, check=check)

    def container(self, service: str) -> str:
        ids = self("ps", "-q", service).stdout.split()
        assert ids, f"no container for {service}"
        return ids[0]

    def down(self) -> None:
        """Stop and remove the project's containers, its network and its named volumes (the compile cache)."""
        self("--profile", "dev", "down", "--volumes", "--remove-orphans", "--timeout", "20", check=False)
