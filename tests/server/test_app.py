"""The app's HTTP side over Starlette's TestClient: metrics, the page and its headers, the origin check."""

from __future__ import annotations

import json
import re

import pytest
from helpers import chat, receive, serving, until_terminal
from starlette.websockets import WebSocketDisconnect

from typewriter.config import ConfigError, Settings


def test_metrics_expose_the_documented_names():
    with serving() as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat())
            until_terminal(lambda: receive(ws))
        text = client.get("/metrics").text
    for name in ("typewriter_requests_total", "typewriter_time_to_first_token_seconds_bucket",
                 "typewriter_inter_token_latency_seconds_bucket", "typewriter_queue_wait_seconds_bucket",
                 "typewriter_generated_tokens_total 5.0", "typewriter_prompt_tokens_total 3.0",
                 "typewriter_active_streams 0.0", "typewriter_queued_requests 0.0"):
        assert name in text


def test_the_real_page_gets_the_settings_as_json_and_every_response_a_strict_csp():
    with serving() as (client, _):
        page = client.get("/")
        health = client.get("/healthz")
        script = client.get("/frontend/app.js")
    assert page.status_code == 200 and "<textarea id=\"question\"" in page.text
    match = re.search(r'<script type="application/json" id="settings">(.*?)</script>', page.text, re.S)
    config = json.loads(match.group(1))
    assert config == {"protocol": 1, "ws_path": "/ws", "readyz_path": "/readyz", "model": "SmolLM2-135M-Instruct",
                      "max_new_tokens": 16, "max_new_tokens_cap": 64,
                      "max_message_bytes": 4096, "max_messages": 8, "class": None}
    assert not re.search(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", page.text)  # no inline code
    assert script.status_code == 200
    for response in (page, health, script):
        csp = response.headers["content-security-policy"]
        assert "script-src 'self';" in csp
        assert "unsafe-inline" not in csp
        assert response.headers["x-content-type-options"] == "nosniff"


def test_a_handshake_from_another_origin_is_refused_and_the_same_origin_is_accepted():
    with serving() as (client, _):
        with pytest.raises(WebSocketDisconnect) as refused:
            with client.websocket_connect("/ws", headers={"origin": "https://evil.example"}):
                pass
        with client.websocket_connect("/ws", headers={"origin": "http://testserver"}) as ws:
            ws.send_json({"type": "ping"})
            assert receive(ws) == {"type": "pong"}
    assert refused.value.code == 1008


def test_a_host_the_server_does_not_answer_to_is_refused_with_400_naming_the_setting():
    with serving() as (client, _):  # allowed_hosts="testserver"
        rebound = client.get("/readyz", headers={"host": "evil.example:8000"})
        with pytest.raises(WebSocketDisconnect):  # DNS rebinding: Host and Origin agree, but the name is not ours
            with client.websocket_connect("/ws", headers={"host": "evil.example", "origin": "http://evil.example"}):
                pass
        fine = client.get("/readyz")
    assert rebound.status_code == 400 and "TYPEWRITER_ALLOWED_HOSTS" in rebound.text
    assert "frame-ancestors 'none'" in rebound.headers["content-security-policy"]  # refusals carry them too
    assert fine.status_code == 200


def test_behind_a_proxy_that_rewrites_host_the_listed_origin_opens_the_socket_and_no_other_does():
    with serving(allowed_hosts="internal.svc,testserver", allowed_origins="https://tutor.school.org") as (client, _):
        proxied = {"host": "internal.svc:8000"}
        with client.websocket_connect("/ws", headers=proxied | {"origin": "https://tutor.school.org"}) as ws:
            ws.send_json({"type": "ping"})
            assert receive(ws) == {"type": "pong"}
        with pytest.raises(WebSocketDisconnect) as refused:
            with client.websocket_connect("/ws", headers=proxied | {"origin": "http://internal.svc:8000"}):
                pass
    assert refused.value.code == 1008


def test_the_default_hosts_are_loopback_and_the_listening_address_and_star_allows_any():
    from typewriter.server.origins import allowed_hosts, origin_allowed

    assert allowed_hosts("", "0.0.0.0") == ["127.0.0.1", "[::1]", "localhost"]
    assert allowed_hosts("", "10.1.2.3") == ["10.1.2.3", "127.0.0.1", "[::1]", "localhost"]
    assert allowed_hosts("", "fd00::7") == ["127.0.0.1", "[::1]", "[fd00::7]", "localhost"]  # as Host writes it
    assert allowed_hosts(" Tutor.School.org , x, ::1 ", "0.0.0.0") == ["[::1]", "tutor.school.org", "x"]
    assert allowed_hosts("*", "127.0.0.1") == ["*"]
    assert origin_allowed(None, "anything", ())  # a command-line client sends no Origin
    assert origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000", ())
    assert not origin_allowed("http://127.0.0.1:9999", "127.0.0.1:8000", ())
    assert origin_allowed("https://Tutor.School.org/", "x", ("https://tutor.school.org",))


@pytest.mark.parametrize(("host", "status"), [
    ("[::1]:8000", 200), ("LocalHost:80", 200), ("tutor.school.org", 200), ("a.tutor.school.org", 200),
    ("school.org", 400), ("a:b", 400), ("", 400), ("evil.example", 400), ("www.localhost", 400)])
def test_the_host_check_is_starlettes_with_an_answer_that_names_the_setting(host, status):
    with serving(allowed_hosts="testserver,localhost,::1,*.tutor.school.org,tutor.school.org") as (client, _):
        response = client.get("/healthz", headers={"host": host})
    assert response.status_code == status
    if status == 400:
        assert response.text.startswith(f"this server does not answer to the host {host!r}; add it to "
                                        "TYPEWRITER_ALLOWED_HOSTS")


def test_a_misplaced_wildcard_in_allowed_hosts_is_a_named_setting_error():
    with pytest.raises(ConfigError, match=r"TYPEWRITER_ALLOWED_HOSTS: 'tutor\.\*\.org': a wildcard must be"):
        Settings.of(allowed_hosts="localhost,tutor.*.org")


def test_with_an_api_key_every_route_but_the_probes_needs_it_and_a_wrong_one_is_refused():
    key = {"authorization": "Bearer s3cret"}
    with serving(api_key="s3cret") as (client, _):
        assert client.get("/readyz").status_code == 200 and client.get("/healthz").status_code == 200
        refused = [client.get(path) for path in ("/", "/metrics", "/frontend/app.js")]
        wrong = client.get("/metrics", headers={"authorization": "Bearer s3cre"})
        assert client.get("/metrics", headers=key).status_code == 200
        with pytest.raises(WebSocketDisconnect):
            with client.websocket_connect("/ws"):
                pass
        with client.websocket_connect("/ws", headers=key) as ws:
            ws.send_json(chat(max_new_tokens=2))
            assert until_terminal(lambda: receive(ws))[-1]["type"] == "end"
    assert {r.status_code for r in refused} | {wrong.status_code} == {401}
    assert refused[1].json()["error"]["code"] == "unauthorized" and refused[1].headers["www-authenticate"] == "Bearer"
    assert all(r.headers["x-content-type-options"] == "nosniff" for r in refused)


def test_with_the_page_exempt_the_page_and_its_own_origins_socket_need_no_key_but_scripts_do():
    with serving(api_key="s3cret", api_key_page=True) as (client, _):
        assert client.get("/").status_code == 200 and client.get("/frontend/app.js").status_code == 200
        assert client.get("/metrics").status_code == 401
        with client.websocket_connect("/ws", headers={"origin": "http://testserver"}) as ws:
            ws.send_json({"type": "ping"})
            assert receive(ws) == {"type": "pong"}
        for headers in ({}, {"origin": "https://evil.example"}):  # a script without the key; another site's page
            with pytest.raises(WebSocketDisconnect):
                with client.websocket_connect("/ws", headers=headers):
                    pass
