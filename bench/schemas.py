"""Real-world JSON Schemas as `response_format`: JSONSchemaBench's 108 (../shared/datasets/jsonschemabench, up to 12
from each of its categories), each sent to our server and to llama.cpp's llama-server on the same GGUF file, and
each answer classified, so that a schema a real client sends is known to be answered, refused by name, or cut.

    .venv/bin/python bench/schemas.py --json bench/results/2026-12-05-real-world-schemas.json
    .venv/bin/python bench/schemas.py --servers ours --limit 12                     # a quick look at ours
    .venv/bin/python bench/schemas.py --servers llama --json llama.json           # one server, then the other:
    .venv/bin/python bench/schemas.py --servers ours --with llama.json --json both.json
    .venv/bin/python bench/schemas.py --report bench/results/2026-12-05-real-world-schemas.json  # the table again

Both servers get the same request over their OpenAI-compatible /v1/chat/completions: a system message asking for
JSON, a user message naming what the schema describes (its title or description, else its file's name), the
schema as `response_format` `{"type": "json_schema", "json_schema": {"name", "schema"}}` (`strict` left out, as
most clients do; `--strict` sends `"strict": true`), temperature 0, `max_tokens` 512. `typewriter serve` replaces
its tutor's prompt with that system message (TYPEWRITER_API_SYSTEM_PROMPT=replace), as llama-server has none of
its own; llama-server runs with `--jinja`, so it renders the GGUF's own chat template. `--concurrency` requests
(4) at a time, to as many slots on each; the servers run one after the other, never together.

Each answer is one of: `refused` (a 4xx: on our server, with its error code, which names the field), `valid`
(`finish_reason` `stop` and the text is JSON that the `jsonschema` package validates against the schema, by the
draft its `$schema` names; `format` is not asserted, as jsonschema's default is), `invalid` (it ended by itself
but is not JSON, or does not validate), `cut` (`finish_reason` `length`: it ran to `max_tokens`), `server error`
(a 5xx, or no answer). `unchecked` marks a schema jsonschema itself cannot apply (a remote `$ref`).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from classroom_servers import HOST, REPO, Server, build_llama_server, embedded_model, free_port

SCHEMAS = REPO.parent / "shared" / "datasets" / "jsonschemabench" / "schemas.json"
SYSTEM = "You write JSON documents. Answer with the JSON document only."
CLASSES = ("valid", "refused", "cut", "invalid", "server error", "unchecked")
TEXT_KEPT = 4000  # characters of each answer kept in the results


def subject(path: str, schema: dict) -> str:
    """What the schema describes, in a line: its title or description, else its file's name."""
    for key in ("title", "description"):
        value = schema.get(key)
        if isinstance(value, str) and value.strip():
            return " ".join(value.split())[:200]
    return Path(path).stem.replace("_", " ")


def request_body(path: str, schema: dict, max_tokens: int, strict: bool) -> dict:
    spec = {"name": "schema", "schema": schema, **({"strict": True} if strict else {})}
    return {"model": "m", "temperature": 0, "max_tokens": max_tokens,
            "response_format": {"type": "json_schema", "json_schema": spec},
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": f"Write an example JSON document for: {subject(path, schema)}"}]}


def check(schema: dict, text: str) -> tuple[str, str | None]:
    """(class, why) of an answer that ended by itself."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as e:
        return "invalid", f"not JSON: {e}"
    try:
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
        error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))), None)
    except Exception as e:  # a remote $ref, or a schema the validator cannot read
        return "unchecked", f"{type(e).__name__}: {str(e)[:200]}"
    if error is not None:
        return "invalid", f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message[:200]}"
    return "valid", None


def ask(url: str, path: str, schema: dict, max_tokens: int, strict: bool) -> dict:
    row: dict = {"path": path, "category": path.split("/")[1]}
    started = time.monotonic()
    try:
        reply = httpx.post(f"{url}/v1/chat/completions", json=request_body(path, schema, max_tokens, strict),
                           timeout=1800)
    except httpx.HTTPError as e:
        return {**row, "class": "server error", "status": None, "why": f"{type(e).__name__}: {e}"}
    row |= {"status": reply.status_code, "seconds": round(time.monotonic() - started, 2)}
    if reply.status_code >= 500:
        return {**row, "class": "server error", "why": reply.text[:300]}
    if reply.status_code >= 400:
        try:
            error = reply.json().get("error", {})
        except ValueError:
            error = {"message": reply.text}
        error = error if isinstance(error, dict) else {"message": str(error)}
        return {**row, "class": "refused", "code": error.get("code"), "why": str(error.get("message"))[:300]}
    answer = reply.json()
    choice = answer["choices"][0]
    text = choice["message"].get("content") or ""
    row |= {"finish_reason": choice["finish_reason"], "completion_tokens": answer["usage"]["completion_tokens"],
            "text": text[:TEXT_KEPT]}
    if choice["finish_reason"] == "length":
        return {**row, "class": "cut", "why": None}
    kind, why = check(schema, text)
    return {**row, "class": kind, "why": why}


def our_server(model: str, slots: int) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port), "--model", model,
            "--max-active", str(slots), "--max-queue", "256", "--max-context", "2048"]
    # the same system message as llama-server's, and every request comes from loopback, where the per-client
    # limits would count them all as one student
    env = {"TYPEWRITER_API_SYSTEM_PROMPT": "replace", "TYPEWRITER_REQUEST_TIMEOUT_S": "none",
           "TYPEWRITER_QUEUE_TIMEOUT_S": "none", "TYPEWRITER_MAX_CONNECTIONS_PER_CLIENT": "100000",
           "TYPEWRITER_CHATS_PER_MINUTE": "100000"}
    return Server("typewriter", argv, port, "/readyz", env)


def llama_server(binary: str, model: str, slots: int, threads: int) -> Server:
    port = free_port()
    argv = [binary, "-m", model, "--host", HOST, "--port", str(port), "--jinja", "-np", str(slots),
            "-c", str(slots * 2048), "-t", str(threads)]
    return Server("llama-server", argv, port, "/health")


def answer_all(server: Server, schemas: dict[str, dict], args: argparse.Namespace) -> list[dict]:
    def one(item: tuple[str, dict]) -> dict:
        return ask(server.http_url, *item, args.max_tokens, args.strict)

    rows = []
    with server.start(timeout_s=600), ThreadPoolExecutor(args.concurrency) as pool:
        for n, row in enumerate(pool.map(one, schemas.items()), start=1):
            rows.append(row)
            print(f"  {server.name} {n}/{len(schemas)} {row['class']:12} {row['path']}", file=sys.stderr, flush=True)
    return rows


def table(results: dict) -> str:
    lines = ["| server | " + " | ".join(CLASSES) + " | valid of all |", "|---" * (len(CLASSES) + 2) + "|"]
    for name, rows in results["servers"].items():
        counts = Counter(r["class"] for r in rows)
        share = f"{counts['valid'] / len(rows):.0%} ({counts['valid']}/{len(rows)})"
        lines.append(f"| {name} | " + " | ".join(str(counts[c]) for c in CLASSES) + f" | {share} |")
    return "\n".join(lines)


def details(results: dict) -> str:
    """Every answer that was not valid, side by side."""
    by_path: dict[str, dict[str, dict]] = {}
    for name, rows in results["servers"].items():
        for row in rows:
            by_path.setdefault(row["path"], {})[name] = row
    names = list(results["servers"])
    lines = ["| schema | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for path, rows in sorted(by_path.items()):
        if all(r["class"] == "valid" for r in rows.values()):
            continue
        cells = []
        for name in names:
            row = rows.get(name)
            if row is None:
                cells.append("")
                continue
            why = (row.get("code") or "") + (": " if row.get("code") else "") + (row.get("why") or "")
            cells.append(f"{row['class']}{' (' + why[:90].replace('|', '/') + ')' if why else ''}")
        lines.append(f"| {path.removeprefix('data/')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
        cpus = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("CPU(s)"))
        return f"{model}, {cpus} CPUs"
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF file (default: the embedded model)")
    parser.add_argument("--servers", default="ours,llama", help="ours, llama or both (comma-separated)")
    parser.add_argument("--schemas", type=Path, default=SCHEMAS)
    parser.add_argument("--limit", type=int, help="only the first N schemas")
    parser.add_argument("--only", help="only the schemas whose path contains this")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--strict", action="store_true", help='send "strict": true')
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="llama-server's -t (on a shared machine, 1: its threads "
                                                               "wait for each other spinning)")
    parser.add_argument("--with", dest="earlier", type=Path,
                        help="an earlier run's results: its servers are kept beside this run's (in --json too)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--report", type=Path, help="print the tables of an earlier run's results and stop")
    args = parser.parse_args()
    if args.report:
        results = json.loads(args.report.read_text())
        print(table(results) + "\n\n" + details(results))
        return
    schemas = json.loads(args.schemas.read_text(encoding="utf-8"))["schemas"]
    if args.only:
        schemas = {k: v for k, v in schemas.items() if args.only in k}
    schemas = dict(list(schemas.items())[: args.limit])
    model = args.model or embedded_model()
    results = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "model": Path(model).name,
               "max_tokens": args.max_tokens, "strict": args.strict, "schemas": len(schemas),
               "command": " ".join(sys.argv), "servers": {}}
    if args.earlier:
        earlier = json.loads(args.earlier.read_text())
        results["servers"] = earlier["servers"]
        results["earlier"] = {k: v for k, v in earlier.items() if k not in ("servers", "earlier")}
    for name in args.servers.split(","):
        if name == "ours":
            server = our_server(model, args.concurrency)
        elif name == "llama":
            server = llama_server(build_llama_server(), model, args.concurrency, args.threads)
        else:
            parser.error(f"--servers: {name!r} is not ours or llama")
        started = time.monotonic()
        results["servers"][server.name] = answer_all(server, schemas, args)
        print(f"{server.name}: {time.monotonic() - started:.0f} s", file=sys.stderr)
        if args.json:  # after each server, so a failure later keeps what was done
            args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    print(table(results) + "\n\n" + details(results))


if __name__ == "__main__":
    main()
