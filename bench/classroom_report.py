"""The classroom benchmark's numbers: one summary per (server, class size), capacity, and the side-by-side table."""

from __future__ import annotations

from collections import Counter

from classroom_clients import Turn

from typewriter.commands import loadtest

TARGET_INTER_TOKEN_P95_MS = 100.0
TARGET_TTFT_P95_MS = 1000.0


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1), as `typewriter loadtest` reports it; None for no values."""
    return loadtest.percentile(values, q) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def summarise(turns: list[Turn], wall_s: float, prefix_hit: float | None) -> dict:
    """One server at one class size. `prefix_hit` comes from the server's /metrics where it has them; otherwise
    from the prompt tokens each answer says were cached, where it says."""
    ttft = [t.ttft_s for t in turns if t.ttft_s is not None]
    gaps = [g for t in turns for g in t.gaps_s]
    tokens = sum(t.completion_tokens for t in turns)
    errors = Counter(t.error for t in turns if t.error)
    if prefix_hit is None and turns and all(t.cached_tokens is not None for t in turns):
        prompt = sum(t.prompt_tokens for t in turns)
        prefix_hit = sum(t.cached_tokens for t in turns) / prompt if prompt else None
    summary = {
        "turns": len(turns),
        "ok": len(turns) - sum(errors.values()),
        "wall_s": round(wall_s, 2),
        "completion_tokens": tokens,
        "prompt_tokens": sum(t.prompt_tokens for t in turns),
        "tokens_per_s": round(tokens / wall_s, 1) if wall_s > 0 else 0.0,
        "ttft_ms": {"p50": _ms(percentile(ttft, 0.5)), "p95": _ms(percentile(ttft, 0.95))},
        "inter_token_ms": {"p50": _ms(percentile(gaps, 0.5)), "p95": _ms(percentile(gaps, 0.95))},
        "max_stall_ms": _ms(max(gaps, default=None)),
        "prefix_hit": None if prefix_hit is None else round(prefix_hit, 3),
        "dropped_messages": sum(t.dropped_messages for t in turns),
        "errors": dict(errors),
        "error_messages": {t.error: t.detail for t in turns if t.error and t.detail},
    }
    summary["meets_target"] = meets_target(summary)
    return summary


def meets_target(s: dict) -> bool:
    itl, ttft = s["inter_token_ms"]["p95"], s["ttft_ms"]["p95"]
    return (not s["errors"] and itl is not None and ttft is not None
            and itl < TARGET_INTER_TOKEN_P95_MS and ttft < TARGET_TTFT_P95_MS)


def best_layout(runs: dict[str, dict]) -> str:
    """Of the peer's runs at one size, by layout: one that meets the target, and of those the most tokens/s."""
    return max(runs, key=lambda name: (runs[name]["meets_target"], runs[name]["tokens_per_s"]))


def capacity(summaries: dict[int, dict]) -> int:
    """The largest class size that met the target; 0 when none did."""
    return max((n for n, s in summaries.items() if s["meets_target"]), default=0)


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(ours: float | None, peer: float | None) -> str:
    return "-" if ours is None or peer is None or peer == 0 else f"{ours / peer:.2f}"


def _pair(s: dict | None, key: str) -> str:
    return "-" if s is None else f"{_num(s[key]['p50'])} / {_num(s[key]['p95'])}"


def _errors(s: dict | None) -> str:
    if s is None:
        return "-"
    shown = ", ".join(f"{code} {n}" for code, n in sorted(s["errors"].items())) or "0"
    return shown + (f" ({s['dropped_messages']} messages dropped)" if s.get("dropped_messages") else "")


def _hit(s: dict | None) -> str:
    return "-" if s is None or s["prefix_hit"] is None else f"{s['prefix_hit']:.0%}"


def table(sizes: list[dict], caps: dict[str, int | None]) -> str:
    """Per class size: ours, the peer's better layout, and ours÷peer (above 1: ours is faster for tokens/s,
    slower for latencies)."""
    lines = []
    for size in sizes:
        ours, peer = size.get("ours"), size.get("peer")
        layout = f", peer layout: {size['peer_layout']}" if peer else ""
        lines.append(f"\n{size['students']} student(s){layout}")
        rows = [("", "ours", "peer", "ours÷peer")]

        def add(name: str, pick, digits: int = 0):
            o, p = (None if s is None else pick(s) for s in (ours, peer))
            rows.append((name, _num(o, digits), _num(p, digits), _ratio(o, p)))

        rows.append(("TTFT p50 / p95 ms", _pair(ours, "ttft_ms"), _pair(peer, "ttft_ms"),
                     " / ".join(_ratio(*(None if s is None else s["ttft_ms"][q] for s in (ours, peer)))
                                for q in ("p50", "p95"))))
        rows.append(("inter-token p50 / p95 ms", _pair(ours, "inter_token_ms"), _pair(peer, "inter_token_ms"),
                     " / ".join(_ratio(*(None if s is None else s["inter_token_ms"][q] for s in (ours, peer)))
                                for q in ("p50", "p95"))))
        add("longest stall ms", lambda s: s["max_stall_ms"])
        add("tokens/s", lambda s: s["tokens_per_s"], 1)
        add("completion tokens", lambda s: s["completion_tokens"])
        rows.append(("prefix hit", _hit(ours), _hit(peer), ""))
        rows.append(("errors", _errors(ours), _errors(peer), ""))
        rows.append(("meets target", *("-" if s is None else ("yes" if s["meets_target"] else "no")
                                       for s in (ours, peer)), ""))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                  for r in rows]
    lines.append("\n" + summary_table(sizes))
    shown = ", ".join(f"{name} {'-' if n is None else n}" for name, n in caps.items())
    lines.append(f"\ncapacity (largest class with inter-token p95 < {TARGET_INTER_TOKEN_P95_MS:.0f} ms, "
                 f"TTFT p95 < {TARGET_TTFT_P95_MS / 1e3:.0f} s, no errors): {shown}")
    return "\n".join(lines)


def summary_table(sizes: list[dict]) -> str:
    """One line per class size, for a README: tokens/s and the p95 latencies, ours against the peer."""
    rows = [("students", "tokens/s ours / peer", "÷", "TTFT p95 ms", "÷", "inter-token p95 ms", "÷", "errors")]
    for size in sizes:
        ours, peer = size.get("ours"), size.get("peer")

        def both(pick, digits: int = 0) -> tuple[str, str]:
            o, p = (None if s is None else pick(s) for s in (ours, peer))
            return f"{_num(o, digits)} / {_num(p, digits)}", _ratio(o, p)

        rows.append((str(size["students"]), *both(lambda s: s["tokens_per_s"], 1),
                     *both(lambda s: s["ttft_ms"]["p95"]), *both(lambda s: s["inter_token_ms"]["p95"]),
                     f"{_errors(ours)} / {_errors(peer)}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)
