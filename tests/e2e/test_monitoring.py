"""Monitoring: the engine's step figures, the metrics the dashboard needs, and the dashboard itself.

Fast: the engine's step observer on the scripted runner, the new histograms over the app, the dashboard JSON and
the provisioning files checked for what Grafana needs. Slow (`services`): Debian's prometheus scrapes a real
`typewriter serve` on the tiny model with the repo's prometheus.yml (only the target changed), and every PromQL
expression of the dashboard returns data through Prometheus' HTTP API.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse

import pytest
import yaml
from helpers import Recorder, chat, receive, serving, until_terminal
from real_server import http_get, real_server
from repo import ROOT
from scripted import letter_runner
from services import ChatLoop, prometheus
from websockets.sync.client import connect

from typewriter.engine.engine import Engine, StepStats
from typewriter.engine.request import GenerationRequest, SamplingParams
from typewriter.server.metrics import Metrics
from typewriter.text.tokenizer import Tokenizer

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "typewriter.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "typewriter.yml"
COMPOSE = DEPLOY.parent / "docker-compose.yml"  # the monitoring profile
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
REPLICAS_YML = DEPLOY / "prometheus" / "prometheus-replicas.yml"
DOCS = ROOT / "docs" / "deploy-monitoring.md"
COMPOSE_TARGET = "typewriter:8000"
# Grafana's own variables, as a query with a 5 s scrape interval would get them over the last minutes.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "5s", "$__range": "5m"}
_SUFFIX = re.compile(r"_(total|bucket|sum|count)$")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict) -> list[dict]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def expressions(board: dict) -> list[str]:
    return [target["expr"] for panel in panels(board) for target in panel.get("targets", [])]


def metric_families(expr: str) -> set[str]:
    return {_SUFFIX.sub("", name) for name in re.findall(r"\btypewriter_\w+", expr)}


def exported_families() -> set[str]:
    return {family.name for family in Metrics(lambda: (0, 0)).registry.collect()}


def as_promql(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a dashboard variable the test does not know: {expr}"
    return expr


# ---- the engine's step observer ----


def test_the_engine_tells_its_observer_each_computing_step_its_time_and_decode_rows(tiny_gguf):
    tokenizer, clock, runner = Tokenizer.load(tiny_gguf), Clock(), letter_runner()
    decode = runner.decode

    def decode_taking_a_quarter_second(*args):
        clock.now += 0.25
        return decode(*args)

    runner.decode = decode_taking_a_quarter_second
    engine = Engine(runner, tokenizer, max_queue=4, prefill_budget=8, clock=clock)
    seen: list[StepStats] = []
    engine.on_step = seen.append
    greedy = SamplingParams(temperature=0.0, repetition_penalty=1.0, max_new_tokens=3)
    recs = [Recorder(), Recorder()]
    for rid, text, rec in (("a", "qa", recs[0]), ("b", "a", recs[1])):
        engine.submit(GenerationRequest(rid, tokenizer.encode(text), greedy), rec)
    for _ in range(4):  # prefill both; two decode steps of both; then nothing is left to compute
        engine.step()
    assert all(rec.done for rec in recs)
    assert seen == [StepStats(0.0, 0), StepStats(0.25, 2), StepStats(0.25, 2)]


def test_draft_tokens_are_counted_taken_and_refused():
    metrics = Metrics(lambda: (0, 0))
    metrics.step(StepStats(0.01, 1, drafted=5, taken=3))
    metrics.step(StepStats(0.01, 2))
    metrics.step(StepStats(0.01, 1, drafted=2, taken=0))
    text = metrics.render().decode()
    assert 'typewriter_draft_tokens_total{outcome="taken"} 3.0' in text
    assert 'typewriter_draft_tokens_total{outcome="refused"} 4.0' in text


def test_an_observer_that_fails_is_dropped_and_the_answer_goes_on(tiny_gguf, caplog):
    tokenizer = Tokenizer.load(tiny_gguf)
    engine = Engine(letter_runner(), tokenizer, max_queue=4, prefill_budget=8, clock=Clock())

    def broken(stats):
        raise ValueError("observer bug")

    engine.on_step = broken
    rec = Recorder()
    engine.submit(GenerationRequest("r", tokenizer.encode("a"), SamplingParams(temperature=0.0, max_new_tokens=4)),
                  rec)
    for _ in range(5):
        engine.step()
    assert rec.done and rec.text == "bcde"
    assert engine.on_step is None and "step observer failed" in caplog.text


def test_the_app_exports_engine_step_time_and_decode_batch_size():
    with serving() as (client, _):
        with client.websocket_connect("/ws") as ws:
            ws.send_json(chat())
            until_terminal(lambda: receive(ws))
        text = client.get("/metrics").text
    steps = float(re.search(r"^typewriter_engine_step_seconds_count (\S+)$", text, re.M).group(1))
    rows = float(re.search(r"^typewriter_engine_batch_size_sum (\S+)$", text, re.M).group(1))
    assert steps >= 4 and rows >= 3  # one prefill step and a decode step per further token of "Hello, world!"
    assert 'typewriter_engine_step_seconds_bucket{le="+Inf"}' in text


# ---- the dashboard and its files ----


def test_every_metric_the_dashboard_uses_is_exported_and_every_exported_one_documented():
    used = set().union(*map(metric_families, expressions(dashboard())))
    exported = exported_families()
    assert used <= exported, f"the dashboard asks for metrics the server does not export: {used - exported}"
    assert {"typewriter_engine_step_seconds", "typewriter_engine_batch_size"} <= used
    docs = DOCS.read_text()
    assert not {name for name in exported if f"`{name}" not in docs}, "metrics missing from the docs"


def test_the_dashboard_has_what_grafana_needs_to_load_it():
    board = dashboard()
    source = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    datasource = {"type": source["type"], "uid": source["uid"]}
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)) >= 10
    cells = set()
    for panel in panels(board):
        assert panel["type"] in ("timeseries", "stat", "gauge", "bargauge", "row") and panel["title"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "hwxy") and grid["x"] + grid["w"] <= 24, panel["title"]
        x0, y0 = grid["x"], grid["y"]
        here = {(x, y) for x in range(x0, x0 + grid["w"]) for y in range(y0, y0 + grid["h"])}
        assert not here & cells, f"{panel['title']} overlaps another panel"
        cells |= here
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == datasource and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == datasource and target["refId"] and target["expr"], panel["title"]


def test_grafana_provisioning_finds_the_dashboard_folder_compose_mounts():
    provider = yaml.safe_load(PROVIDERS.read_text())["providers"][0]
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == \
        f"{provider['options']['path']}/{DASHBOARD.name}"


def test_both_prometheus_configs_scrape_the_job_the_dashboard_counts():
    single, replicas = (yaml.safe_load(path.read_text()) for path in (PROMETHEUS_YML, REPLICAS_YML))
    (job,), (replica_job,) = single["scrape_configs"], replicas["scrape_configs"]
    assert job["job_name"] == replica_job["job_name"] == "typewriter" and job["metrics_path"] == "/metrics"
    assert job["static_configs"] == [{"targets": [COMPOSE_TARGET]}] == replica_job["static_configs"]
    assert replica_job["dns_sd_configs"][0]["names"] == ["replica"]
    assert single["global"] == replicas["global"]
    assert any(f'job="{job["job_name"]}"' in expr for expr in expressions(dashboard()))


# ---- a real Prometheus against a real server ----


def scrape_config(target: str) -> str:
    """The repo's prometheus.yml with only its target replaced."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    (job,) = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": [COMPOSE_TARGET]}]
    job["static_configs"] = [{"targets": [target]}]
    return yaml.safe_dump(config)


def query(prom: str, expr: str) -> list[dict]:
    status, body = http_get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", f"{expr}: {body}"
    return answer["data"]["result"]


def has_data(result: list[dict]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


@pytest.mark.services
@pytest.mark.slow
@pytest.mark.e2e
def test_prometheus_scrapes_a_real_server_and_every_dashboard_query_returns_data(tmp_path, tiny_gguf):
    settings = {"TYPEWRITER_MODEL_PATH": str(tiny_gguf), "TYPEWRITER_SYSTEM_PROMPT": "Be brief.",
                "TYPEWRITER_MAX_CONTEXT": "256", "TYPEWRITER_MAX_ACTIVE": "2", "TYPEWRITER_CHATS_PER_MINUTE": "100000"}
    board = dashboard()
    exprs = sorted({as_promql(expr) for expr in expressions(board)})
    with real_server(settings, tmp_path / "server.log") as base:
        url = base.replace("http://", "ws://", 1) + "/ws"
        loops = [ChatLoop(url, f"c{i}", pause_s=0.1).start() for i in range(3)]  # 3 chats on 2 slots: a queue
        try:
            with connect(url, open_timeout=10) as ws:  # one rejection, so the rejections panel has a series
                ws.send("not json")
                assert json.loads(ws.recv(timeout=10))["code"] == "invalid_json"
            with prometheus(scrape_config(base.removeprefix("http://")), tmp_path / "prometheus") as prom:
                started = time.monotonic()
                while not has_data(query(prom, 'count_over_time(up{job="typewriter"}[1m]) >= 3')):
                    assert time.monotonic() - started < 60, "prometheus did not scrape the server 3 times in 60 s"
                    time.sleep(1)
                assert [s["value"][1] for s in query(prom, 'up{job="typewriter"}')] == ["1"]
                waited = time.monotonic() - started
                empty = exprs
                deadline = time.monotonic() + 20  # a rate needs two scrapes that saw its series change
                while empty and time.monotonic() < deadline:
                    empty = [expr for expr in empty if not has_data(query(prom, expr))]
                    if empty:
                        time.sleep(2)
        finally:
            for loop in loops:
                loop.stop()
    print(f"{len(exprs)} dashboard queries answered after {waited:.0f} s of scraping; "
          f"{sum(len(loop.chats) for loop in loops)} chats meanwhile")
    assert not empty, f"dashboard queries without data: {empty}"
    assert all(chat[-1]["type"] == "end" for loop in loops for chat in loop.chats)
