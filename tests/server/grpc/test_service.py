"""The gRPC front door over real grpcio on loopback: typewriter.v1.Chat on the real engine with a scripted
runner (a chat, stop, cancel, every refusal as a status with our code), the health service, reflection, the API
key, the server of `typewriter serve --grpc-port`, the checked-in stubs, and one end-to-end run on the tiny model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import WAIT_S, small_settings
from real_server import ROOT, grpc_address, real_server
from scripted import factory, script_engine
from tiny_model import HOLD_TOKENS, LONG_SETTINGS
from websockets.sync.client import connect

from typewriter.config import Settings
from typewriter.server.app import create_app
from typewriter.server.chat_request import PARAMS
from typewriter.server.grpc.gen import chat_pb2 as pb
from typewriter.server.grpc.gen import chat_pb2_grpc
from typewriter.server.grpc.server import GrpcServer
from typewriter.server.grpc.service import ERROR_CODE_KEY, STATUS, peer_address
from typewriter.server.lifecycle import ServerState
from typewriter.server.main import Server, uvicorn_config
from typewriter.server.refusal import ERROR_CODES

GEN_DIR = ROOT / "backend" / "typewriter" / "server" / "grpc" / "gen"
Health = health_pb2.HealthCheckResponse


# ---- an in-process gRPC server on the test's event loop ----


@dataclass
class Served:
    state: ServerState
    engine: object
    stub: chat_pb2_grpc.ChatStub
    channel: grpc.aio.Channel


@asynccontextmanager
async def serving(engine=None, gate: threading.Event | None = None, wait_ready: bool = True, **settings):
    engine = engine or script_engine()
    state = ServerState(small_settings(**settings), factory(engine, gate))
    state.start_loading()
    if wait_ready:
        await until(lambda: state.ready, "the server is ready")
    server = GrpcServer(state)
    port = await server.start("127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(state, engine, chat_pb2_grpc.ChatStub(channel), channel)
    finally:
        if gate is not None:
            gate.set()
        await channel.close()
        await state.drain()
        await server.stop(0)


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario, 3 * WAIT_S))


async def until(condition, what: str) -> None:
    for _ in range(int(WAIT_S / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{what} was not met within {WAIT_S:.0f} s")


def chat(request_id: str = "g1", text: str = "say hello", messages=None, **params) -> pb.ClientMessage:
    messages = messages if messages is not None else [("user", text)]
    return pb.ClientMessage(chat=pb.ChatRequest(
        id=request_id, messages=[pb.Message(role=r, content=c) for r, c in messages], params=pb.Params(**params)))


def stop(request_id: str = "") -> pb.ClientMessage:
    return pb.ClientMessage(stop=pb.StopRequest(id=request_id))


def kinds(events) -> list[str]:
    return [e.WhichOneof("kind") for e in events]


def text_of(events) -> str:
    return "".join(e.token.text for e in events if e.WhichOneof("kind") == "token")


async def events_of(call) -> list[pb.ServerEvent]:
    """The rest of the call's events (read, not iterated: a test may have read some and may write)."""
    events = []
    while (event := await call.read()) is not grpc.aio.EOF:
        events.append(event)
    return events


async def refusal(call, *messages: pb.ClientMessage, done_writing: bool = False
                  ) -> tuple[grpc.StatusCode, str | None, str]:
    """(status, our code, details) of a call that must fail, once it is sent `messages` (a write may be the one to
    fail: the server may refuse the call before it reads)."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        for message in messages:
            await call.write(message)
        if done_writing:
            await call.done_writing()
        await events_of(call)
    e = failed.value
    return e.code(), dict(e.trailing_metadata() or ()).get(ERROR_CODE_KEY), e.details()


def gauge(state: ServerState, name: str, labels: str = "") -> float:
    metrics = state.metrics.render().decode()
    found = re.search(rf"^{re.escape(name + labels)} (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


# ---- a chat ----


def test_a_chat_streams_start_tokens_and_end_as_protocol_v1_frames_and_ends_the_rpc_ok():
    async def scenario():
        async with serving() as s:
            call = s.stub.Stream()
            await call.write(chat("a1", temperature=0, top_k=5, seed=7, stop=["\n\n"]))
            await call.done_writing()  # a client that has nothing more to say does not cancel its chat
            events = await events_of(call)
            return events, await call.code(), s.engine.submitted

    events, code, submitted = run(scenario())
    assert code is grpc.StatusCode.OK
    assert kinds(events) == ["start", "token", "token", "token", "token", "end"]
    assert {e.id for e in events} == {"a1"}
    assert events[0].start == pb.Start(prompt_tokens=3, cached_tokens=0, dropped_messages=0)
    assert text_of(events) == "Hello, world!"
    assert [e.token.index for e in events[1:-1]] == [0, 1, 2, 3]
    end = events[-1].end
    assert (end.reason, end.usage) == ("eos", pb.Usage(prompt_tokens=3, completion_tokens=5))
    assert end.timings.total_ms > 0
    [request] = submitted
    params = request.params
    assert (params.temperature, params.top_k, params.seed, params.stop) == (0, 5, 7, ("\n\n",))  # 0 is given
    assert (params.top_p, params.repetition_penalty, params.max_new_tokens) == (0.9, 1.1, 16)  # unset: defaults


def test_the_params_message_has_exactly_the_protocols_params_and_every_code_has_a_status():
    assert [f.name for f in pb.Params.DESCRIPTOR.fields] == list(PARAMS)
    assert set(STATUS) == set(ERROR_CODES) | {"unauthorized"}


def test_stop_mid_answer_keeps_the_partial_text_and_ends_cancelled():
    async def scenario():
        async with serving(script_engine([f"w{i} " for i in range(50)], step_s=0.03)) as s:
            call = s.stub.Stream()
            await call.write(chat("s1", max_new_tokens=50))
            before = [await call.read() for _ in range(3)]
            await call.write(stop("s1"))
            after = await events_of(call)
            await until(lambda: s.engine.stats().active == 0, "the slot is free")
            return before, after, await call.code(), gauge(s.state, "typewriter_requests_total", '{reason="cancelled"}')

    before, after, code, cancelled = run(scenario())
    assert kinds(before) == ["start", "token", "token"]
    assert len([e for e in after if e.WhichOneof("kind") == "token"]) <= 1
    assert (after[-1].WhichOneof("kind"), after[-1].end.reason, code) == ("end", "cancelled", grpc.StatusCode.OK)
    assert text_of(before + after).startswith("w0 w1 ")
    assert cancelled == 1


def test_a_stop_without_an_id_stops_the_streams_chat():
    async def scenario():
        async with serving(script_engine(["x"] * 100, step_s=0.03)) as s:
            call = s.stub.Stream()
            await call.write(chat("s2", max_new_tokens=60))
            assert (await call.read()).WhichOneof("kind") == "start"
            await call.write(stop())
            return await events_of(call)

    assert run(scenario())[-1].end.reason == "cancelled"


@pytest.mark.parametrize("how", ["cancel", "deadline", "channel closed"])
def test_an_rpc_that_ends_mid_answer_cancels_its_chat_and_frees_the_slot(how, caplog):
    async def scenario():
        async with serving(script_engine(["x"] * 500, step_s=0.02), max_new_tokens_cap=200) as s:
            call = s.stub.Stream(timeout=0.5 if how == "deadline" else None)
            await call.write(chat("c1", max_new_tokens=200))
            assert (await call.read()).WhichOneof("kind") == "start"
            assert (await call.read()).WhichOneof("kind") == "token"
            if how == "cancel":
                call.cancel()
            elif how == "channel closed":
                await s.channel.close()
            await until(lambda: s.engine.submitted and not s.engine.stats().active, "the slot is free")
            await until(lambda: gauge(s.state, "typewriter_requests_total", '{reason="cancelled"}') == 1,
                        "the cancel is counted")
            await until(lambda: s.state.limits.total == 0, "the stream is no longer counted")
            return s.state.readiness()[0]

    with caplog.at_level(logging.INFO, logger="typewriter.requests"):
        assert run(scenario())
    [record] = [json.loads(r.getMessage()) for r in caplog.records if r.name == "typewriter.requests"]
    assert (record["reason"], record["cancelled_by"]) == ("cancelled", "disconnect")
    assert record["completion_tokens"] < 100  # cancelled within a step or two, not run to 200


def test_chats_beyond_the_slots_are_queued_and_beyond_the_queue_resource_exhausted():
    async def scenario():
        async with serving(script_engine(["x"] * 8, step_s=0.05, slots=1, max_queue=1)) as s:
            a, b, c = s.stub.Stream(), s.stub.Stream(), s.stub.Stream()
            await a.write(chat("a"))
            assert (await a.read()).WhichOneof("kind") == "start"
            await b.write(chat("b"))
            queued = await b.read()
            return queued, await refusal(c, chat("c")), await events_of(a), await events_of(b)

    queued, (status, code, details), a_events, b_events = run(scenario())
    assert queued == pb.ServerEvent(id="b", queued=pb.Queued(position=1))
    assert (status, code) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded")
    assert details.startswith("overloaded: ")
    assert a_events[-1].end.reason == b_events[-1].end.reason == "eos"


# ---- refusals: a status, with our code in the trailing metadata and at the start of the details ----

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(("messages", "code", "status"), [
    ([chat(temperature=9)], "invalid_request", INVALID),
    ([chat(temperature=float("nan"))], "invalid_request", INVALID),
    ([chat(max_new_tokens=65)], "invalid_request", INVALID),
    ([chat(max_new_tokens=0)], "invalid_request", INVALID),  # set to 0 is given, and out of range
    ([chat(stop=[""])], "invalid_request", INVALID),
    ([chat("")], "invalid_request", INVALID),
    ([chat("y" * 65)], "invalid_request", INVALID),
    ([chat(messages=[])], "invalid_request", INVALID),
    ([chat(messages=[("assistant", "hi")])], "invalid_request", INVALID),
    ([chat(messages=[("teacher", "hi")])], "invalid_request", INVALID),
    ([chat(messages=[("user", "hi")] * 9)], "invalid_request", INVALID),
    ([chat(text="word " * 250, max_new_tokens=10)], "prompt_too_long", INVALID),
    ([pb.ClientMessage()], "invalid_request", INVALID),
    ([], "invalid_request", INVALID),
    ([stop("ghost")], "not_found", grpc.StatusCode.NOT_FOUND),
])
def test_a_bad_request_ends_the_rpc_with_a_status_and_our_code(messages, code, status):
    async def scenario():
        async with serving() as s:
            refused = await refusal(s.stub.Stream(), *messages, done_writing=True)
            await until(lambda: s.state.limits.total == 0, "the stream is no longer counted")
            return refused, s.engine.submitted, gauge(
                s.state, "typewriter_rejected_requests_total", f'{{code="{code}"}}')

    (got_status, got_code, details), submitted, rejected = run(scenario())
    assert (got_status, got_code) == (status, code)
    assert details.startswith(f"{code}: ") and len(details) > len(code) + 10
    assert submitted == [] and rejected == 1


def test_a_system_message_follows_the_servers_prompt_and_the_setting_can_refuse_it():
    system = chat(messages=[("system", "Answer in French."), ("user", "hi")])

    async def scenario(**settings):
        async with serving(**settings) as s:
            call = s.stub.Stream()
            await call.write(system)
            await call.done_writing()
            try:
                return [e.WhichOneof("kind") for e in await events_of(call)], s.engine
            except grpc.aio.AioRpcError as e:
                return (e.code(), dict(e.trailing_metadata())[ERROR_CODE_KEY]), s.engine

    answered, engine = run(scenario())
    assert answered[-1] == "end"
    assert engine.tokenizer.calls[0] == ([{"role": "user", "content": "hi"}], "Be brief.\n\nAnswer in French.")
    refused, engine = run(scenario(api_system_prompt="refuse"))
    assert refused == (INVALID, "system_prompt_not_allowed") and engine.submitted == []


@pytest.mark.parametrize(("second", "code", "status"), [
    (chat("again"), "busy", grpc.StatusCode.FAILED_PRECONDITION),
    (stop("other"), "not_found", grpc.StatusCode.NOT_FOUND),
])
def test_a_second_chat_or_a_stop_for_another_id_ends_the_rpc_and_cancels_its_chat(second, code, status):
    async def scenario():
        async with serving(script_engine(["x"] * 500, step_s=0.02), max_new_tokens_cap=200) as s:
            call = s.stub.Stream()
            await call.write(chat("first", max_new_tokens=200))
            assert (await call.read()).WhichOneof("kind") == "start"
            refused = await refusal(call, second)
            await until(lambda: not s.engine.stats().active, "the slot is free")
            return refused

    got_status, got_code, details = run(scenario())
    assert (got_status, got_code) == (status, code)
    assert "first" in details


def test_a_failed_generation_is_internal():
    async def scenario():
        engine = script_engine(["x"] * 50, step_s=0.01)
        async with serving(engine) as s:
            engine.runner.fail("decode", RuntimeError("the device went away"))
            return await refusal(s.stub.Stream(), chat("f1"))

    status, code, details = run(scenario())
    assert (status, code) == (grpc.StatusCode.INTERNAL, "internal")
    assert details.startswith("internal: generation failed")


def test_more_chats_a_minute_than_allowed_are_rate_limited_with_a_retry_after():
    async def scenario():
        async with serving(chats_per_minute=1) as s:
            first = s.stub.Stream()
            await first.write(chat("r1"))
            await events_of(first)
            second = s.stub.Stream()
            return await refusal(second, chat("r2")), dict(await second.trailing_metadata())

    (status, code, details), trailers = run(scenario())
    assert (status, code) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "rate_limited")
    assert "try again in" in details
    assert 55 <= int(trailers["retry-after"]) <= 60


def test_streams_count_against_the_connections_per_address_like_sockets():
    async def scenario():
        async with serving(script_engine(["x"] * 100, step_s=0.02), max_connections_per_client=1) as s:
            first = s.stub.Stream()
            await first.write(chat("k1", max_new_tokens=60))
            assert (await first.read()).WhichOneof("kind") == "start"
            assert s.state.limits.open == {"127.0.0.1": 1}
            refused = await refusal(s.stub.Stream(), chat("k2"))
            await first.write(stop())
            await events_of(first)
            await until(lambda: s.state.limits.total == 0, "the stream is no longer counted")
            return refused

    status, code, details = run(scenario())
    assert (status, code) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded")
    assert "too many connections from your address" in details


def test_with_an_api_key_chat_needs_it_but_health_and_reflection_do_not():
    async def scenario():
        async with serving(api_key="s3cret") as s:
            results = []
            for metadata in [None, (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)]:
                results.append(await refusal(s.stub.Stream(metadata=metadata), chat("k")))
            call = s.stub.Stream(metadata=(("authorization", "Bearer s3cret"),))
            await call.write(chat("k"))
            events = await events_of(call)
            health = await health_pb2_grpc.HealthStub(s.channel).Check(health_pb2.HealthCheckRequest())
            return results, events, health.status, await list_services(s.channel)

    refusals, events, health, services = run(scenario())
    for status, code, details in refusals:
        assert (status, code) == (grpc.StatusCode.UNAUTHENTICATED, "unauthorized")
        assert "authorization: Bearer <key>" in details
    assert text_of(events) == "Hello, world!"
    assert health == Health.SERVING and "typewriter.v1.Chat" in services


# ---- health, loading, draining, reflection ----


async def health_of(channel, service: str = "") -> int:
    return (await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))).status


async def list_services(channel) -> list[str]:
    call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    response = await call.read()
    await call.done_writing()
    return [s.name for s in response.list_services_response.service]


def test_health_is_not_serving_while_loading_serving_once_ready_and_not_serving_from_the_drain_on():
    async def scenario():
        gate = threading.Event()
        async with serving(gate=gate, wait_ready=False) as s:
            watch = health_pb2_grpc.HealthStub(s.channel).Watch(
                health_pb2.HealthCheckRequest(service="typewriter.v1.Chat"))
            watched = [(await watch.read()).status]
            loading = [await health_of(s.channel), await health_of(s.channel, "typewriter.v1.Chat")]
            while_loading = await refusal(s.stub.Stream(), chat())
            gate.set()
            watched.append((await watch.read()).status)  # the health service follows the state
            ready = [await health_of(s.channel), await health_of(s.channel, "typewriter.v1.Chat")]
            s.state.begin_drain()
            watched.append((await watch.read()).status)
            watch.cancel()
            draining = await health_of(s.channel)
            while_draining = await refusal(s.stub.Stream(), chat())
            return watched, loading, while_loading, ready, draining, while_draining

    watched, loading, while_loading, ready, draining, while_draining = run(scenario())
    assert watched == [Health.NOT_SERVING, Health.SERVING, Health.NOT_SERVING]
    assert loading == [Health.NOT_SERVING] * 2 and ready == [Health.SERVING] * 2
    assert draining == Health.NOT_SERVING
    status, code, details = while_loading
    assert (status, code) == (grpc.StatusCode.UNAVAILABLE, None)  # not a protocol code: the socket's close 1013
    assert "loading" in details
    assert while_draining[:2] == (grpc.StatusCode.UNAVAILABLE, "shutdown")


def test_a_health_check_answers_the_state_as_it_is_not_as_last_polled(monkeypatch):
    monkeypatch.setattr("typewriter.server.grpc.server.HEALTH_POLL_S", 3600)  # the watch poll never comes round

    async def scenario():
        gate = threading.Event()
        async with serving(gate=gate, wait_ready=False) as s:
            loading = await health_of(s.channel)
            gate.set()
            await until(lambda: s.state.ready, "the server is ready")  # what /readyz answers from
            ready = [await health_of(s.channel), await health_of(s.channel, "typewriter.v1.Chat")]
            s.state.begin_drain()
            return loading, ready, await health_of(s.channel)

    loading, ready, draining = run(scenario())
    assert loading == Health.NOT_SERVING
    assert ready == [Health.SERVING] * 2
    assert draining == Health.NOT_SERVING


def test_reflection_lists_the_chat_and_health_services_and_describes_the_chat_service():
    async def scenario():
        async with serving() as s:
            call = reflection_pb2_grpc.ServerReflectionStub(s.channel).ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol="typewriter.v1.Chat"))
            described = await call.read()
            await call.done_writing()
            return await list_services(s.channel), described

    services, described = run(scenario())
    assert {"typewriter.v1.Chat", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(services)
    files = described.file_descriptor_response.file_descriptor_proto
    assert files and b"typewriter/v1/chat.proto" in files[0]


def test_a_drain_ends_a_running_grpc_chat_with_reason_shutdown():
    async def scenario():
        async with serving(script_engine(["x"] * 500, step_s=0.02), drain_s=0.2, max_new_tokens_cap=200) as s:
            call = s.stub.Stream()
            await call.write(chat("d1", max_new_tokens=200))
            assert (await call.read()).WhichOneof("kind") == "start"
            drained = asyncio.create_task(s.state.drain())
            events = await events_of(call)
            await drained
            return events, await call.code()

    events, code = run(scenario())
    assert (events[-1].end.reason, code) == ("shutdown", grpc.StatusCode.OK)


def test_peer_address_is_the_ip_of_grpcs_peer_string():
    assert peer_address("ipv4:127.0.0.1:50512") == "127.0.0.1"
    assert peer_address("ipv6:[::1]:50512") == "::1"
    assert peer_address("unix:/tmp/socket") is None


# ---- the stubs are what the .proto generates ----


def test_the_checked_in_stubs_are_what_gen_grpc_sh_generates(tmp_path):
    subprocess.run(["bash", str(ROOT / "scripts" / "gen-grpc.sh"), str(tmp_path)], check=True,
                   env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, timeout=60)
    generated = sorted(path.name for path in tmp_path.iterdir())
    assert generated == ["chat_pb2.py", "chat_pb2.pyi", "chat_pb2_grpc.py"]
    for name in generated:
        assert (GEN_DIR / name).read_text() == (tmp_path / name).read_text(), \
            f"{name} differs from what proto/typewriter/v1/chat.proto generates: run scripts/gen-grpc.sh"


# ---- `typewriter serve --grpc-port`: the uvicorn Server starts gRPC beside it ----


@contextlib.contextmanager
def uvicorn_server(engine, **overrides):
    settings = Settings.of(**{**dict(port=0, system_prompt="Be brief.", max_new_tokens=16, max_new_tokens_cap=64,
                                  shutdown_grace_s=2.0, drain_s=0.5), **overrides})
    app = create_app(settings, factory(engine))
    server = Server(uvicorn_config(app, settings, host="127.0.0.1", log_level="warning"), app.state.server)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server, thread
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "the server did not stop"


def test_serve_starts_grpc_beside_http_on_the_port_it_prints_and_stops_it_after_the_drain(capsys):
    with uvicorn_server(script_engine(["ab"] * 100, step_s=0.02), grpc_port=0) as (server, thread):
        address = _printed_grpc_address(capsys)
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + WAIT_S
            while health.Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S).status != Health.SERVING:
                assert time.monotonic() < deadline, "gRPC health never said SERVING"
                time.sleep(0.05)
            stub = chat_pb2_grpc.ChatStub(channel)
            full = list(stub.Stream(iter([chat("u1")]), timeout=WAIT_S))
            requests = Requests(chat("u2", max_new_tokens=60))
            running = stub.Stream(iter(requests), timeout=WAIT_S)
            assert next(running).WhichOneof("kind") == "start"
            server.handle_exit(None, None)  # as SIGTERM does: drain, then stop
            rest = list(running)
            requests.close()
        thread.join(timeout=10)
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=0.5)  # stopped with the server
    assert text_of(full) == "ab" * 16 and full[-1].end.reason == "length"
    assert rest[-1].end.reason == "shutdown"
    assert not server.grpc_failed


class Requests:
    """The request iterator of a sync stub's stream: what `put` gives, until `close`."""

    def __init__(self, *first: pb.ClientMessage):
        self.queue: queue.Queue[pb.ClientMessage | None] = queue.Queue()
        for message in first:
            self.put(message)

    def put(self, message: pb.ClientMessage) -> None:
        self.queue.put(message)

    def close(self) -> None:
        self.queue.put(None)

    def __iter__(self):
        while (message := self.queue.get(timeout=3 * WAIT_S)) is not None:
            yield message


def _printed_grpc_address(capsys) -> str:
    deadline, out = time.monotonic() + WAIT_S, ""
    while time.monotonic() < deadline:
        out += capsys.readouterr().out
        if found := re.search(r"^gRPC on (\S+)$", out, re.M):
            return found.group(1)
        time.sleep(0.02)
    raise AssertionError(f"no 'gRPC on' line: {out!r}")


def test_a_grpc_port_in_use_stops_the_server_before_the_model_loads_with_one_line(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with uvicorn_server(script_engine(), grpc_port=port) as (server, thread):
            thread.join(timeout=10)
    assert server.grpc_failed and not thread.is_alive()
    assert (server.state.progress, server.state.engine) == ("starting", None)  # the loader never ran
    assert capsys.readouterr().err.splitlines() == [
        f"typewriter: error: gRPC port {port} on 127.0.0.1 is already in use (another server listens there); "
        "stop it, or choose another port with --grpc-port (0 picks a free one)"]


# ---- end to end: `typewriter serve --grpc-port 0` on the tiny model ----

E2E_SETTINGS = {"TYPEWRITER_SYSTEM_PROMPT": "Be brief.", "TYPEWRITER_MAX_CONTEXT": "256", "TYPEWRITER_MAX_ACTIVE": "2",
                "TYPEWRITER_MAX_NEW_TOKENS_CAP": "200", "TYPEWRITER_CHATS_PER_MINUTE": "1000"}


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_server_streams_a_chat_over_grpc_and_stops_one_mid_answer(tmp_path, long_tiny_gguf):
    log = tmp_path / "server.log"
    # the answer stopped is HOLD_TOKENS long, so the stop lands mid-answer however fast the machine (200 tokens took
    # the tiny model tens of milliseconds)
    settings = E2E_SETTINGS | LONG_SETTINGS
    with real_server(settings | {"TYPEWRITER_MODEL_PATH": str(long_tiny_gguf)}, log, args=["--grpc-port", "0"]) as base:
        address = grpc_address(log)
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT_S)
            stub = chat_pb2_grpc.ChatStub(channel)
            full = list(stub.Stream(iter([chat("e1", "hello", temperature=0, max_new_tokens=8)]), timeout=60))
            with connect(base.replace("http://", "ws://", 1) + "/ws", open_timeout=10) as ws:  # the same, on v1
                ws.send(json.dumps({"type": "chat", "id": "w1", "messages": [{"role": "user", "content": "hello"}],
                                    "params": {"temperature": 0, "max_new_tokens": 8}}))
                frames = [json.loads(ws.recv(timeout=60))]
                while frames[-1]["type"] not in ("end", "error"):
                    frames.append(json.loads(ws.recv(timeout=60)))
            # repetition favoured (below 1) and the loop guard off: uncut, this greedy answer runs 2,278 tokens to
            # its eos, a quarter of a second or more (the tiny model ends "tell me a story" after 6 tokens)
            requests = Requests(chat("e2", "why is the sky blue", temperature=0, max_new_tokens=HOLD_TOKENS,
                                     repetition_penalty=0.5, loop_guard=False))
            cut = []
            try:
                for event in stub.Stream(iter(requests), timeout=60):
                    cut.append(event)
                    if event.WhichOneof("kind") == "token" and len(cut) == 2:  # start, then the first token
                        requests.put(stop("e2"))
            finally:
                requests.close()
    assert health.status == Health.SERVING
    assert kinds(full)[0] == "start" and kinds(full)[-1] == "end"
    assert full[-1].end.usage.completion_tokens <= 8 and full[-1].end.reason in ("length", "eos")
    assert text_of(full) == "".join(f.get("text", "") for f in frames)  # greedy: the socket's answer
    assert full[-1].end.reason == frames[-1]["reason"]
    assert cut[-1].end.reason == "cancelled"
    assert cut[-1].end.usage.completion_tokens < HOLD_TOKENS


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dropped_grpc_chat_asked_again_greedy_goes_on_where_the_client_was(tmp_path, tiny_gguf):
    """What grpc.md says a client does after a dropped stream, since gRPC keeps nothing to resume: ask again, skip
    the tokens below the first index it lacks, and (greedy) the rest is what the dropped answer would have said."""
    log = tmp_path / "server.log"
    with real_server(E2E_SETTINGS | {"TYPEWRITER_MODEL_PATH": str(tiny_gguf)}, log, args=["--grpc-port", "0"]):
        with grpc.insecure_channel(grpc_address(log)) as channel:
            stub = chat_pb2_grpc.ChatStub(channel)
            for question in ("tell me a story", "aaaa", "hello there", "zzzz", "1 2 3 4", "xyz xyz"):
                # the tiny model's random weights: the first question whose greedy answer runs long enough to cut
                request = chat("d1", question, temperature=0, max_new_tokens=120, repetition_penalty=0.5,
                               loop_guard=False)  # repetition favoured, so that the answer runs long
                whole = list(stub.Stream(iter([request]), timeout=60))
                if sum(e.WhichOneof("kind") == "token" for e in whole) > 6:
                    break
            held: list[pb.Token] = []
            dropped = stub.Stream(iter([request]), timeout=60)
            for event in dropped:
                if event.WhichOneof("kind") == "token":
                    held.append(event.token)
                    if len(held) == 3:
                        dropped.cancel()  # as a broken stream: the client holds three tokens
                        break
            again = list(stub.Stream(iter([request]), timeout=60))
    lacking = held[-1].index + 1
    rest = [e.token for e in again if e.WhichOneof("kind") == "token" and e.token.index >= lacking]
    assert len(held) == 3 and rest, "the answer was not cut mid-way"
    assert "".join(t.text for t in held + rest) == text_of(whole)
    assert (again[-1].end.reason, again[-1].end.usage.completion_tokens) == \
        (whole[-1].end.reason, whole[-1].end.usage.completion_tokens)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (payloads under 128 bytes)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize(("chat_id", "content"), [(b"g1", b"hi \xed\xbf\xbf"), (b"\xed\xbf\xbf", b"hi"),
                                                  (b"g1", b"hi \xff")], ids=["surrogate", "id", "not utf-8"])
def test_a_string_that_is_not_utf8_is_invalid_argument_with_our_code_and_starts_nothing(chat_id, content):
    """Protobuf's strings must be UTF-8; a client that writes other bytes gets our code, as on the socket, not
    gRPC's bare UNKNOWN, and no chat starts."""
    raw = _field(1, _field(1, chat_id) + _field(2, _field(1, b"user") + _field(2, content)))

    async def scenario():
        async with serving() as s:
            call = s.channel.stream_stream("/typewriter.v1.Chat/Stream", request_serializer=lambda b: b,
                                           response_deserializer=pb.ServerEvent.FromString)()
            await call.write(raw)
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await events_of(call)
            assert s.engine.submitted == []
            return refused.value

    error = run(scenario())
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in error.details()
    assert dict(error.trailing_metadata())[ERROR_CODE_KEY] == "invalid_request"
