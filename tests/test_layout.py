"""The package's architecture, checked: no import cycles, and each folder imports only what its contract allows
(the engine no TensorFlow, LiteRT or transformers; the models and runners no tokenizer; the server no runtime
until it loads a model; only config.py reads the environment)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "backend" / "typewriter"


def _module_name(path: Path) -> str:
    parts = ["typewriter", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "gen" not in p.parts}


def _imports(name: str) -> set[str]:
    """Every typewriter module `name` imports, at its top or inside a function (a cycle through a lazy import is
    still a cycle in the design)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `from .x import name`: the module is x
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):  # a package's own __init__
                found.add(target)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_another_that_imports_it_back():
    assert _cycles() == []


def test_the_import_graph_sees_lazy_imports_and_would_report_a_cycle():
    """The check above cannot pass by seeing nothing: assemble.py imports the runners inside functions."""
    assert {"typewriter.runners.lite.start", "typewriter.runners.xla.start"} <= GRAPH["typewriter.assemble"]
    GRAPH["typewriter.engine.prefix_cache"].add("typewriter.engine.scheduler")  # a made-up cycle
    try:
        assert _cycles() == [["typewriter.engine.prefix_cache", "typewriter.engine.scheduler"]]
    finally:
        GRAPH["typewriter.engine.prefix_cache"].discard("typewriter.engine.scheduler")


def _reachable(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for nxt in GRAPH[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


@pytest.mark.parametrize("folder, forbidden", [
    ("engine", ("typewriter.runners", "typewriter.server", "typewriter.text.tokenizer", "typewriter.assemble")),
    ("architecture", ("typewriter.text", "typewriter.runners", "typewriter.engine", "typewriter.server")),
    ("weights", ("typewriter.text", "typewriter.runners", "typewriter.engine", "typewriter.server")),
    ("runners", ("typewriter.text", "typewriter.server", "typewriter.assemble")),
    ("text", ("typewriter.runners", "typewriter.server", "typewriter.engine")),
    ("config", ("typewriter.",)),  # a leaf: everything may read the settings
    ("client", ("typewriter.server", "typewriter.engine", "typewriter.runners", "typewriter.text")),
    # the doors share the server's core, never each other (gRPC speaks the socket's frames: socket/pump.py)
    ("server.socket", ("typewriter.server.openai", "typewriter.server.grpc")),
    ("server.openai", ("typewriter.server.socket", "typewriter.server.grpc")),
    ("server.grpc", ("typewriter.server.openai", "typewriter.server.socket.session")),
    ("server.resume", ("typewriter.server.socket", "typewriter.server.openai", "typewriter.server.grpc")),
])
def test_each_folder_imports_only_what_its_contract_allows(folder, forbidden):
    members = [m for m in MODULES if m == f"typewriter.{folder}" or m.startswith(f"typewriter.{folder}.")]
    assert members
    for module in members:
        bad = sorted(m for m in _reachable(module) if m.startswith(forbidden))
        assert not bad, f"{module} reaches {bad}"


def test_importing_the_engine_and_the_server_loads_no_model_library():
    """The engine never imports TensorFlow, LiteRT or transformers, and the server imports a runtime only on its
    loader thread: checked in a fresh interpreter, where nothing else has imported them first."""
    code = ("import sys\n"
            "import typewriter.engine.engine, typewriter.engine.scheduler, typewriter.engine.request_state\n"
            "engine = {m for m in ('tensorflow', 'ai_edge_litert', 'transformers') if m in sys.modules}\n"
            "import typewriter.server.app, typewriter.client\n"
            "server = {m for m in ('tensorflow', 'ai_edge_litert') if m in sys.modules}\n"
            "print(sorted(engine), sorted(server))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[0] == "[] []", out.stdout + out.stderr


def test_only_config_reads_the_environment():
    readers = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getenv"
            subscripted = (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                           and node.value.attr == "environ" and isinstance(node.ctx, ast.Load))
            got = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                   and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "environ")
            if called or subscripted or got:
                readers.append(name)
    assert set(readers) <= {"typewriter.config"}, readers


def test_no_test_file_imports_another():
    """What several test files share lives in a helper module (helpers.py, page_harness.py, ...), never in a test
    file that pytest also collects."""
    importers = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importers += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert importers == []


TESTS = Path(__file__).resolve().parent
ACROSS = ("e2e", "frontend")  # end to end through several modules: browsers, Docker, services, real servers
PACKAGE_WIDE = {"test_layout.py", "test_bench_scripts.py", "test_bench_grading.py"}  # the tree, and bench/


def _unmirrored(test_files: list[Path]) -> list[str]:
    """Test files (relative to tests/) that name no module: tests/x/y/test_z.py must test backend/typewriter/x/y/
    z.py (test_z_aspect.py one aspect of it, and a folder's own name its package, as client/test_client.py)."""
    strays = []
    for rel in test_files:
        if rel.parts[0] in ACROSS or (len(rel.parts) == 1 and rel.name in PACKAGE_WIDE):
            continue
        folder = PACKAGE.joinpath(*rel.parts[:-1])
        stem = rel.stem.removeprefix("test_")
        names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        names |= {folder.name} if rel.parts[:-1] else set()
        if not folder.is_dir() or not any(stem == n or stem.startswith(n + "_") for n in names):
            strays.append(str(rel))
    return strays


def test_tests_mirror_the_package():
    files = sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))
    assert len(files) > 80 and _unmirrored(files) == []


def test_the_mirror_check_would_report_a_test_of_no_module():
    assert _unmirrored([Path("engine/test_nothing.py"), Path("test_stray.py"), Path("nowhere/test_x.py")]) == [
        "engine/test_nothing.py", "test_stray.py", "nowhere/test_x.py"]
    assert _unmirrored([Path("engine/test_scheduler_fairness.py"), Path("server/socket/test_session.py"),
                        Path("client/test_client.py"), Path("e2e/test_anything.py")]) == []
