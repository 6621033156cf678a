"""The slot count sized from measured step times: the step model read off probe steps, the most slots under the
capacity bar (and in memory), and a load that sizes them, keeps the measurement beside its cached programs (with
how busy the machine was while it measured: a figure taken under load is measured again at the next start) and
shows the choice on /readyz's runtime."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from typewriter import assemble
from typewriter.config import WeightFormat
from typewriter.engine.capacity import (
    BUSY,
    HEADROOM,
    INTER_TOKEN_S,
    MOST_SLOTS,
    P95_STEPS,
    PROBE_ROWS,
    Probe,
    StepModel,
    size_slots,
    typical_position,
)

BUDGET = INTER_TOKEN_S * HEADROOM / P95_STEPS


def test_the_step_model_is_read_off_probe_steps_of_one_and_many_rows_at_two_positions():
    truth = StepModel(fixed_s=0.004, per_row_s=0.0007, per_row_position_s=2e-6)
    seen = []

    def measure(probes):
        seen.extend(probes)
        return [truth.step_s(rows, position) for rows, position in probes]

    fit = StepModel.fit(measure)
    assert {rows for rows, _ in seen} == {1, PROBE_ROWS} and len(set(seen)) == len(seen) == 4  # asked at once
    for got, want in zip((fit.fixed_s, fit.per_row_s, fit.per_row_position_s),
                         (truth.fixed_s, truth.per_row_s, truth.per_row_position_s)):
        assert got == pytest.approx(want, rel=1e-6)


def test_the_slots_are_the_most_rows_whose_step_leaves_room_for_a_prefill_under_the_bar():
    model = StepModel(fixed_s=0.005, per_row_s=0.001, per_row_position_s=1e-6)
    sizing = size_slots(Probe(model), 2048, kv_bytes_per_token=100_000, available_bytes=None)
    position = typical_position(2048)
    assert model.step_s(sizing.slots, position) <= BUDGET < model.step_s(sizing.slots + 1, position)
    assert sizing.sized_by == "measured step time" and sizing.step_ms == pytest.approx(
        model.step_s(sizing.slots, position) * 1000)
    assert sizing.most == MOST_SLOTS and sizing.adapts  # every slot allocated, `slots` of them open at start
    fast = size_slots(Probe(StepModel(0.001, 1e-6, 0.0)), 2048, 1, None)
    assert fast.slots == MOST_SLOTS  # never more than the most
    slow = size_slots(Probe(StepModel(0.5, 0.01, 0.0)), 2048, 1, None)
    assert slow.slots == 1  # one student, however slow: a server that serves no one helps no one


def test_memory_caps_the_slots_when_their_caches_would_not_fit():
    model = StepModel(0.001, 1e-5, 0.0)
    roomy = size_slots(Probe(model), 2048, kv_bytes_per_token=50_000, available_bytes=64 * 2**30)
    tight = size_slots(Probe(model), 2048, kv_bytes_per_token=50_000, available_bytes=2 * 2**30)
    assert roomy.slots == MOST_SLOTS and tight.sized_by == "memory"
    assert tight.slots * 2048 * 50_000 <= 0.5 * 2 * 2**30 < (tight.slots + 1) * 2048 * 50_000
    assert tight.most == tight.slots  # nor may the count rise past what fits


def test_the_start_up_line_says_when_the_figure_was_measured_under_load():
    model = StepModel(fixed_s=0.005, per_row_s=0.001, per_row_position_s=1e-6)
    idle = size_slots(Probe(model, others=BUSY / 2), 2048, 1, None)
    busy = size_slots(Probe(model, others=0.64), 2048, 1, None)
    assert busy.slots == idle.slots  # the figure decides the count; the flag says whether to trust it
    assert "under load" not in idle.summary() and idle.describe()["measured_under_load"] is False
    assert "measured under load: other processes took 64% of the CPU time" in busy.summary()
    assert busy.describe()["measured_under_load"] is True
    assert f"moves within 1-{MOST_SLOTS}" in idle.summary() and idle.describe()["bounds"] == [1, MOST_SLOTS]


def test_a_load_sizes_its_slots_keeps_the_measurement_and_a_set_count_wins(tiny_gguf, tmp_path):
    cache = tmp_path / "lite"

    def load(slots):
        said = []
        engine, _, _ = assemble.load(tiny_gguf, slots=slots, max_context=64, max_queue=2, prefill_budget=8,
                                    weight_format="int8-lite", program_cache=str(cache), progress=said.append)
        try:
            return engine.max_active, engine.describe_runtime()["slots"], said
        finally:
            engine.shutdown()

    slots, described, said = load(None)
    assert 1 <= slots <= MOST_SLOTS and described["count"] == slots
    assert described["sized_by"] in ("measured step time", "memory") and described["decode_step_ms"] > 0
    assert any(f"{slots} slots" in line for line in said)
    (measured,) = cache.glob("*/capacity.json")
    stored = json.loads(measured.read_text())
    assert set(stored["model"]) == {"fixed_s", "per_row_s", "per_row_position_s"} and "others" in stored
    if stored["others"] is not None and stored["others"] > BUSY:  # the machine is shared: kept as if idle
        measured.write_text(json.dumps(stored | {"others": 0.0}))
    stamp = measured.stat().st_mtime_ns
    again, _, _ = load(None)
    assert again == slots and measured.stat().st_mtime_ns == stamp  # a warm start measures nothing
    set_count, described, _ = load(3)
    assert set_count == 3 and described == {"count": 3, "sized_by": "set"}


def test_a_figure_measured_under_load_is_measured_again_and_the_faster_kept(tmp_path, monkeypatch):
    from typewriter.runners.lite import start as lite_load

    class Runner:
        slots, max_len = 64, 2048
        weight_format = WeightFormat.INT8_LITE

        def step(self, slots, tokens, positions):
            pass

    shares = iter([0.7, 0.5, 0.0])  # others' share of the CPUs during each probe
    per_row = iter([0.004, 0.006, 0.003])  # each probe's steps: the second busy start measured slower still
    monkeypatch.setattr(lite_load.OthersBusy, "share", lambda self: next(shares))
    monkeypatch.setattr(lite_load.StepModel, "fit", classmethod(lambda cls, measure, max_len, rows: cls(
        0.005, next(per_row), 0.0)))
    said = []
    first = lite_load.fit_step_model(Runner(), tmp_path)
    assert first.under_load and first.model.per_row_s == 0.004
    second = lite_load.fit_step_model(Runner(), tmp_path, progress=said.append)
    assert any("measured under load; measuring again" in line for line in said)
    assert second == first  # busy again, and slower: the faster figure stays, still marked
    third = lite_load.fit_step_model(Runner(), tmp_path)
    assert not third.under_load and third.model.per_row_s == 0.003  # an idle start's figure, kept for good
    assert lite_load.fit_step_model(Runner(), tmp_path) == third  # and nothing measured: `per_row` is spent


def test_a_machine_busy_at_every_start_stops_being_measured_after_three_starts(tmp_path, monkeypatch):
    """A neighbour (a poller, another service) that always takes more than BUSY of the CPUs: each start measured
    the steps again, for seconds, for good."""
    from typewriter.runners.lite import start as lite_load

    class Runner:
        slots, max_len = 64, 2048
        weight_format = WeightFormat.INT8_LITE

        def step(self, slots, tokens, positions):
            pass

    shares = iter([0.3] * lite_load.MOST_PROBES)  # each probe busy: an iterator spent by one more would raise
    per_row = iter([0.005, 0.004, 0.006])
    monkeypatch.setattr(lite_load.OthersBusy, "share", lambda self: next(shares))
    monkeypatch.setattr(lite_load.StepModel, "fit", classmethod(lambda cls, measure, max_len, rows: cls(
        0.005, next(per_row), 0.0)))
    kept = [lite_load.fit_step_model(Runner(), tmp_path) for _ in range(lite_load.MOST_PROBES)]
    assert all(k.under_load for k in kept) and kept[-1].model.per_row_s == 0.004  # the fastest of the three
    said = []
    assert lite_load.fit_step_model(Runner(), tmp_path, progress=said.append) == kept[-1]
    assert said == []  # nothing measured, nothing said


def test_the_probe_takes_its_steps_in_turns_and_keeps_each_probes_fastest(monkeypatch):
    from typewriter.runners.lite import start as lite_load

    class Runner:
        slots, max_len = 64, 2048
        weight_format = WeightFormat.INT8_LITE
        calls: ClassVar[list[tuple[int, int]]] = []

        def step(self, slots, tokens, positions):
            self.calls.append((len(slots), positions[0]))

    clock = iter(range(10_000))  # every timed step takes 1 s
    monkeypatch.setattr(lite_load.time, "perf_counter", lambda: next(clock))
    runner = Runner()
    lite_load.fit_step_model(runner, None, rounds=3)
    probes = list(dict.fromkeys(runner.calls))
    assert len(probes) == 4 and runner.calls == [p for p in probes for _ in range(2)] * 3  # in turns, each twice
    assert lite_load.fit_step_model(runner, None, measure_now=False) is None  # nothing kept, nothing measured


def test_other_processes_cpu_time_counts_as_load():
    """A real load: a process spinning beside this one shows in others' share of the machine's CPU time."""
    import os
    import subprocess
    import sys
    import time

    from typewriter.runners.lite.machine import OthersBusy

    def share_over(seconds):
        busy, end = OthersBusy(), time.monotonic() + seconds
        while time.monotonic() < end:
            pass  # this process's own time is not counted
        return busy.share()

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        loaded = share_over(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert loaded is not None and loaded >= 0.8 / (os.cpu_count() or 1)  # one CPU of the machine's, at least
