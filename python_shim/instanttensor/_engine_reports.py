"""What the engine reports of an open, reshaped for Python: stats() as a dict of ints, floats
and strings, timeline() as a list of dicts."""

from __future__ import annotations

from typing import Any


def engine_stats(engine: Any) -> dict[str, Any]:
    """The engine's counters (counts as ints, times in seconds as floats) with its backend,
    exchange and staging descriptions."""
    counters: dict[str, Any] = {
        k: (int(v) if float(v).is_integer() and not k.endswith("seconds") else v)
        for k, v in engine.stats().items()
    }
    counters["backend"] = engine.backend()
    counters["exchange"] = engine.exchange()
    counters["staging"] = engine.staging()
    return counters


def timeline_events(engine: Any) -> list[dict[str, Any]]:
    """The engine's timeline: one dict per event (kind, start, end, bytes, tag)."""
    return [{"kind": k, "start": s, "end": e, "bytes": b, "tag": t}
            for k, s, e, b, t in engine.timeline()]
