"""Every benchmark script still imports against the package: a refactor that moves a name they use fails here,
not on the day someone next runs the benchmark."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from repo import BENCH


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_bench_script_imports(path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the classroom scripts import each other
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    if '__name__ == "__main__"' in path.read_text():  # a script, not one of the classroom's helper modules
        assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
