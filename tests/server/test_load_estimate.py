"""The load's progress as numbers a student's sentence can use (server/load_estimate.py): the share of the step
that counts, and the time it has left at its rate so far; nothing where there is no basis. And /readyz carrying
them beside the developer's progress words."""

from __future__ import annotations

import threading

from helpers import small_settings, wait_until
from starlette.testclient import TestClient

from typewriter.server.app import create_app
from typewriter.server.load_estimate import LoadEstimate


def test_a_step_without_a_count_gives_no_numbers():
    estimate = LoadEstimate()
    assert estimate.at(0.0) == {}
    estimate.report("loading /models/SmolLM2-135M-Instruct.Q4_1.gguf", 0.0)
    assert estimate.at(1.0) == {}


def test_one_count_gives_the_share_done_but_no_time_left_until_there_is_a_rate():
    estimate = LoadEstimate()
    estimate.report("int8-lite: program 6/32", 1.0)
    assert estimate.at(1.5) == {"fraction": 0.188}


def test_the_time_left_is_the_rest_of_the_step_at_the_rate_so_far_counting_down_to_nothing():
    estimate = LoadEstimate()
    estimate.report("int8-lite: program 6/32", 1.0)
    estimate.report("int8-lite: program 12/32", 3.0)  # 6 programs in 2 s: 20 more take about 6.7 s
    assert estimate.at(3.0) == {"fraction": 0.375, "left_s": 6.7}
    assert estimate.at(5.0) == {"fraction": 0.375, "left_s": 4.7}
    assert estimate.at(10.0) == {"fraction": 0.375}  # later than it said: no wrong number
    estimate.report("int8-lite: program 18/32", 4.0)  # faster than before: the rate is the whole step's
    assert estimate.at(4.0) == {"fraction": 0.562, "left_s": 3.5}  # 12 in 3 s: 14 more in 3.5 s


def test_a_finished_step_has_nothing_left_and_the_next_step_starts_afresh():
    estimate = LoadEstimate()
    estimate.report("weights 5/10", 0.0)
    estimate.report("weights 10/10", 1.0)
    assert estimate.at(1.0) == {"fraction": 1.0}
    estimate.report("compiled 1/4: decode_1", 2.0)
    assert estimate.at(2.5) == {"fraction": 0.25}  # a new step: no rate carried over from the weights
    estimate.report("int8-lite: sizing the slots by step time", 3.0)
    assert estimate.at(3.0) == {}


def test_readyz_gives_the_estimate_beside_the_progress_words_while_loading():
    gate = threading.Event()
    reported = threading.Event()

    def load(settings, progress):
        from scripted import script_engine

        progress("int8-lite: program 6/32")
        progress("int8-lite: program 12/32")
        reported.set()
        assert gate.wait(timeout=30)
        engine = script_engine()
        return engine, engine.tokenizer

    app = create_app(small_settings(), load)
    with TestClient(app) as client:
        assert reported.wait(timeout=10)
        body = client.get("/readyz").json()
        gate.set()
        wait_until(lambda: client.get("/readyz").status_code == 200, "ready")
        ready = client.get("/readyz").json()
    assert body["status"] == "loading" and body["progress"] == "int8-lite: program 12/32"
    assert body["fraction"] == 0.375
    assert "left_s" not in body or body["left_s"] >= 0  # the two counts came microseconds apart
    assert "fraction" not in ready and "left_s" not in ready


def test_digits_in_a_path_are_not_a_count():
    estimate = LoadEstimate()
    estimate.report("loading /models/v1/2.gguf", 0.0)
    assert estimate.at(0.0) == {}
    estimate.report("compiled 3/12: decode_8", 1.0)
    assert estimate.at(1.0) == {"fraction": 0.25}
