"""The soak benchmark's short version: clients that finish, stop, abandon, send garbage and reconnect against a
real server (the tiny model) for 20 seconds; nothing leaks and every watched chat gets exactly one end."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from repo import BENCH

pytestmark = [pytest.mark.e2e, pytest.mark.slow]



def test_a_short_soak_leaks_no_stream_and_ends_every_watched_chat_exactly_once(monkeypatch, tmp_path, tiny_gguf,
                                                                              capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_soak", BENCH / "soak.py")
    soak = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, soak)
    spec.loader.exec_module(soak)
    code = soak.main(["--clients", "6", "--seconds", "20", "--model", str(tiny_gguf), "--system-prompt", "Be brief.",
                      "--json", str(tmp_path / "soak.json")])
    result = json.loads((tmp_path / "soak.json").read_text())
    assert code == 0, result
    assert result["leaked_streams"] == 0 and result["not_exactly_one_terminal"] == 0
    assert result["completed"] > 0 and result["cancelled"] > 0 and result["abandoned"] > 0
    assert result["closes"].get("1003", 0) > 0  # binary garbage closed sockets, and the clients came back
