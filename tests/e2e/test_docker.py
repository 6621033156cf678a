"""The container, really built and run on a Docker engine: docker-compose.yml and the Dockerfile as shipped.

The engine comes from scripts/docker-engine.sh (Debian's dockerd, started here if none runs, and stopped again at
the end only then); the base image from scripts/docker-base-image.sh (a stand-in from Debian's packages where the
image registry cannot be reached). Everything runs on the host's network, the server on loopback on a free port.
The measured numbers (image size, build time, launch to /readyz 200 with an empty and with a filled compile-cache
volume) are written to artifacts/docker.json; the test asserts only that each start gets ready.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from docker_env import (
    BASE_IMAGE_SCRIPT,
    BUILD_TIMEOUT_S,
    ROOT,
    ComposeProject,
    free_port,
    host_network_compose,
    http_status,
    image_size,
    inspect,
    last_line,
    sh,
    start_engine,
    stop_engine,
    wait_ready,
)
from helpers import default_weights
from websockets.sync.client import connect

from typewriter.config import Serving
from typewriter.weights.source import embedded_model_path

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SERVE_IMAGE = "typewriter:test"
DEV_IMAGE = "typewriter:test-dev"
STOP_GRACE_S = 15.0  # docker-compose.yml's stop_grace_period
MEASURED = ROOT / "artifacts" / "docker.json"


@pytest.fixture(scope="session")
def docker_engine():
    """A Docker engine that answers; stopped at the end only if this session started it."""
    started = start_engine()
    yield
    if started:
        stop_engine()


@pytest.fixture(scope="module")
def measured():
    numbers: dict[str, object] = {}
    yield numbers
    MEASURED.parent.mkdir(exist_ok=True)
    MEASURED.write_text(json.dumps(numbers, indent=2) + "\n")


@pytest.fixture(scope="module")
def project(docker_engine, tmp_path_factory, measured):
    """The repo's Compose file under a project of its own, its images built; torn down with its volumes."""
    port, jupyter_port = free_port(), free_port()
    file = host_network_compose(tmp_path_factory.mktemp("compose") / "docker-compose.yml", SERVE_IMAGE, DEV_IMAGE,
                                jupyter_port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TYPEWRITER_")}  # no stray settings
    compose = ComposeProject(f"typewritertest{os.getpid()}", file, env, port, jupyter_port)
    measured["base_image"] = last_line(sh([str(BASE_IMAGE_SCRIPT)], timeout=900).stdout)
    try:
        start = time.monotonic()
        compose("--profile", "dev", "build", timeout=BUILD_TIMEOUT_S)
        measured["build_s"] = round(time.monotonic() - start, 1)
        measured["image_bytes"] = image_size(SERVE_IMAGE)
        measured["dev_image_bytes"] = image_size(DEV_IMAGE)
        yield compose
    finally:
        compose.down()


def test_the_image_has_no_build_tools_pip_cache_or_test_packages(project):
    for tool in ("gcc", "cc", "g++", "make"):
        found = sh(["docker", "run", "--rm", "--entrypoint", "sh", SERVE_IMAGE, "-c", f"command -v {tool}"],
                   check=False)
        assert found.returncode != 0, f"{tool} is in the image: {found.stdout}"
    script = ("test ! -e /root/.cache/pip && test ! -e /home/typewriter/.cache/pip && "
              "test ! -e /usr/local/lib/python3.11/site-packages/tensorflow/include && "
              "! python -c 'import pytest' 2>/dev/null && ! python -c 'import playwright' 2>/dev/null")
    sh(["docker", "run", "--rm", "--user", "root", "--entrypoint", "sh", SERVE_IMAGE, "-c", script])


def test_a_bad_setting_stops_the_container_with_a_named_error(project):
    done = project("run", "--rm", "-T", "typewriter", env={"TYPEWRITER_MAX_ACTIVE": "lots"}, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "typewriter: error: TYPEWRITER_MAX_ACTIVE: must be an integer or 'none', got 'lots'" in output
    assert "Traceback" not in output


@pytest.fixture(scope="module")
def server(project, measured):
    """`compose up -d typewriter` with an empty compile-cache volume; its URL once /readyz answers 200."""
    start = time.monotonic()
    project("up", "-d", "typewriter")
    base = f"http://127.0.0.1:{project.port}"
    measured["first_ready_s"] = round(wait_ready(f"{base}/readyz", project.container("typewriter"), start), 1)
    return base


def test_it_runs_as_a_non_root_user_and_compose_exec_gives_a_shell(project, server):
    done = project("exec", "-T", "typewriter", "bash", "-c", "id -u; id -un")
    uid, name = done.stdout.split()
    assert uid != "0" and name == "typewriter"


def test_it_turns_healthy_on_a_port_that_is_not_the_default(project, server):
    assert project.port != 8000
    container = project.container("typewriter")
    deadline = time.monotonic() + 60  # the health check runs every 5 s
    while (health := inspect(container)["State"]["Health"])["Status"] != "healthy":
        assert time.monotonic() < deadline, f"not healthy: {health['Log'][-1:]}"
        time.sleep(1)


def test_a_chat_over_the_socket_from_outside_the_container(project, server):
    with connect(f"ws://127.0.0.1:{project.port}/ws", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "chat", "id": "q1", "messages": [{"role": "user", "content": "Say hello."}],
                            "params": {"max_new_tokens": 12, "temperature": 0}}))
        frames = read_until_terminal(ws)
    assert frames[0]["type"] == "start"
    assert frames[-1]["type"] == "end" and frames[-1]["reason"] in ("eos", "length"), frames[-1]
    assert "".join(f["text"] for f in frames if f["type"] == "token").strip()


def test_docker_stop_ends_running_chats_with_shutdown_and_exits_0(project, server):
    container = project.container("typewriter")
    with connect(f"ws://127.0.0.1:{project.port}/ws", open_timeout=10) as ws:
        # Greedy with no repetition penalty, this story loops to max_new_tokens (with the default penalty it ends by
        # eos after 463 tokens). The test's drain is 0 s, so the answer need only outlast `compose stop` reaching
        # the server (with a drain of 2 s, a fast machine wrote all 1,000 tokens inside it).
        params = {"max_new_tokens": 1000, "temperature": 0, "repetition_penalty": 1.0, "loop_guard": False}
        ws.send(json.dumps({"type": "chat", "id": "long", "params": params,
                            "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}]}))
        frames = [json.loads(ws.recv(timeout=60))]
        while frames[-1]["type"] != "token":  # the answer is streaming
            frames.append(json.loads(ws.recv(timeout=60)))
        start = time.monotonic()
        stopping = subprocess.Popen(project.base + ["stop", "typewriter"], env=project.env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            frames += read_until_terminal(ws)
            stopping.wait(timeout=STOP_GRACE_S + 30)
        finally:
            stopping.kill()
    stop_s = time.monotonic() - start
    last = frames[-1]
    assert (last["type"], last.get("reason") or last.get("code")) in (("end", "shutdown"), ("error", "shutdown")), last
    state = inspect(container)["State"]
    assert (state["Status"], state["ExitCode"], state["OOMKilled"]) == ("exited", 0, False), state
    # The shipped drain comes on top of this stop's own time, and the two must fit the grace period.
    shipped = Serving().drain_s + stop_s
    assert shipped < STOP_GRACE_S, f"the stop took {stop_s:.1f} s: with the {Serving().drain_s} s drain, past the " \
                                   "grace period, so it would be killed"


def test_a_second_start_reads_the_compiled_programs_from_the_volume(project, server, measured):
    """fp32 compiles XLA programs (the default, q4-blocks or int8-lite, has none to compile): its first start fills
    the volume and the next container reads them back."""
    fp32 = {"TYPEWRITER_WEIGHTS": "fp32"}
    url = f"http://127.0.0.1:{project.port}/readyz"
    project("rm", "--force", "typewriter")
    project("up", "-d", "typewriter", env=fp32)
    measured["fp32_first_ready_s"] = round(wait_ready(url, project.container("typewriter"), time.monotonic()), 1)
    volume = f"{project.name}_xla-cache"
    cached = sh(["docker", "run", "--rm", "-v", f"{volume}:/cache", "--entrypoint", "ls", SERVE_IMAGE, "/cache/xla"])
    assert cached.stdout.split(), "the first run left no compiled programs on the volume"
    project("rm", "--force", "typewriter")  # a new container, as after `docker compose down`; the volume stays
    start = time.monotonic()
    project("up", "-d", "typewriter", env=fp32)
    measured["fp32_second_ready_s"] = round(wait_ready(url, project.container("typewriter"), start), 1)
    measured["programs_cached_by_the_first_run"] = len(cached.stdout.split())
    # Back to the defaults for the tests after this one: the container runs on this CPU, so its default is this
    # machine's (q4-blocks' blocks on AVX-512 VNNI, else int8-lite's programs), which the first default start saved.
    kept = ("q4-blocks: blocks from" if default_weights(embedded_model_path()) == "q4-blocks" else
            "int8-lite: programs from")
    lite = sh(["docker", "run", "--rm", "-v", f"{volume}:/cache", "--entrypoint", "ls", SERVE_IMAGE, "/cache/lite"])
    assert lite.stdout.split(), "the default start left nothing of its weight format's on the volume"
    project("rm", "--force", "typewriter")
    start = time.monotonic()
    project("up", "-d", "typewriter")
    measured["default_second_ready_s"] = round(wait_ready(url, project.container("typewriter"), start), 1)
    logs = project("logs", "typewriter").stdout
    assert f"{kept} /var/cache/typewriter/lite" in logs
    assert "attention runs in numpy" not in logs  # the image's kernel stage built attention.c, no compiler needed


def test_the_dev_profile_serves_jupyterlab_over_the_mounted_repo(project, server):
    project("--profile", "dev", "up", "-d", "dev")
    wait_ready(f"http://127.0.0.1:{project.port}/readyz", project.container("typewriter"), time.monotonic())
    deadline = time.monotonic() + 120
    while http_status(f"http://127.0.0.1:{project.jupyter_port}/api") != 200:
        assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
        time.sleep(0.5)
    listed = project("exec", "-T", "dev", "ls", "/app/examples").stdout.split()
    assert sorted(listed) == sorted(p.name for p in (ROOT / "examples").iterdir())
    # The notebooks' server, from inside the dev container, through the same websockets package they use.
    ask = ("import json, os; from websockets.sync.client import connect; "
           "ws = connect(os.environ['TYPEWRITER_URL'].replace('http', 'ws') + '/ws'); "
           "ws.send(json.dumps({'type': 'chat', 'id': 'd', 'messages': [{'role': 'user', 'content': 'Hi'}], "
           "'params': {'max_new_tokens': 4}})); frames = [json.loads(ws.recv(60)) for _ in range(2)]; "
           "print(frames[0]['type'])")
    assert project("exec", "-T", "dev", "python", "-c", ask).stdout.strip() == "start"
    # Under Compose's own network the dev container reaches the server by its service name.
    assert http_status(f"http://127.0.0.1:{project.port}/healthz", {"Host": f"typewriter:{project.port}"}) == 200


def read_until_terminal(ws) -> list[dict]:
    frames = [json.loads(ws.recv(timeout=60))]
    while frames[-1]["type"] not in ("end", "error"):
        frames.append(json.loads(ws.recv(timeout=60)))
    return frames
