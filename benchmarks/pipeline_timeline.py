"""One pass of the device pipeline laid out in time: what each stage did when, and what bounds it.

Used by device_pipeline.py --timeline. A sample recorded with INSTANTTENSOR_TIMELINE=1 carries the
loader's events (safe_open.timeline(): reads in their read calls, staging slices placed and freed,
copies queued, the host's waits) and, on the simulated device, its copy engine's log (each copy's
start and end); all on time.monotonic. From them, per pass:
  disk busy      share of the pass with at least one read inside its read calls
  engine busy    share with the host->device engine copying (simulated device only)
  consumer wait  share the consumer blocked for bytes; copy wait: the host blocked on a copy
  disk idle      the rest of the disk's time, split by why: the open (headers, the cold read
                 method probe, plans), the staging ring full (up to the limit then in force: every
                 slice read and waiting for its copy), the tail (every read done, copies finishing), other (a read could
                 have been submitted and was not)
  bound by       the stage busy >= 90% of the pass, else the largest idle share
"""

from __future__ import annotations


def _union(intervals, lo: float, hi: float) -> list[tuple[float, float]]:
    """The union of (start, end) intervals clipped to [lo, hi], sorted and merged."""
    merged: list[list[float]] = []
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _gaps(busy, lo: float, hi: float) -> list[tuple[float, float]]:
    gaps, at = [], lo
    for s, e in busy:
        if s > at:
            gaps.append((at, s))
        at = max(at, e)
    if hi > at:
        gaps.append((at, hi))
    return gaps


def _staging_steps(events) -> list[tuple[float, int]]:
    """(time, staging bytes in use after it) at each slice placed or freed."""
    steps, in_use = [], 0
    for e in sorted((e for e in events if e["kind"] in ("staging_placed", "staging_freed")),
                    key=lambda e: e["start"]):
        in_use += e["bytes"] if e["kind"] == "staging_placed" else -e["bytes"]
        steps.append((e["start"], in_use))
    return steps


def analyse(sample: dict) -> dict:
    """The shares above for one sample (a dict with timeline, engine_log, pass_start, pass_end,
    staging_bytes)."""
    events = sample["timeline"]
    lo, hi = sample["pass_start"], sample["pass_end"]
    wall = hi - lo
    of = lambda kind: [(e["start"], e["end"]) for e in events if e["kind"] == kind]  # noqa: E731
    reads = _union(of("read"), lo, hi)
    engine = _union([(s, e) for s, e, _ in sample.get("engine_log") or []], lo, hi)
    opened = _union(of("open"), lo, hi)
    read_seconds = sum(e - s for s, e in of("read"))
    result = {
        "wall_s": wall,
        "open_s": _length(opened),
        "first_read_s": min((s for s, _ in of("read")), default=hi) - lo,
        "disk_busy": _length(reads) / wall,
        "reads_in_calls_mean": read_seconds / _length(reads) if reads else 0.0,
        "engine_busy": _length(engine) / wall if sample.get("engine_log") is not None else None,
        "consumer_wait": _length(_union(of("consumer_wait"), lo, hi)) / wall,
        "copy_wait": _length(_union(of("copy_wait"), lo, hi)) / wall,
        "staging_full_events": sum(1 for e in events if e["kind"] == "staging_full"),
    }
    # Why the disk was idle: each gap between reads, by what held at its middle.
    last_read_end = max((e for _, e in of("read")), default=lo)
    steps = _staging_steps(events)
    limits = sorted((e["start"], e["bytes"]) for e in events if e["kind"] == "staging_limit")
    largest = max((e["bytes"] for e in events if e["kind"] == "staging_placed"), default=0)
    idle = {"open": 0.0, "ring full": 0.0, "tail": 0.0, "other": 0.0}
    for s, e in _gaps(reads, lo, hi):
        middle = (s + e) / 2
        in_use = 0
        for t, used in steps:
            if t > middle:
                break
            in_use = used
        ring = sample.get("staging_bytes") or 0  # the ring, or the limit then in force
        in_force = [limit for t, limit in limits if t <= middle]
        if in_force:
            ring = min(in_force[-1], ring) if ring else in_force[-1]
        if any(a <= middle <= b for a, b in opened) or middle < result["first_read_s"] + lo:
            idle["open"] += e - s
        elif middle >= last_read_end:
            idle["tail"] += e - s
        elif ring and in_use + largest > ring:
            idle["ring full"] += e - s
        else:
            idle["other"] += e - s
    result["disk_idle"] = {k: v / wall for k, v in idle.items()}
    busy = {"reads": result["disk_busy"]}
    if result["engine_busy"] is not None:
        busy["copy engine"] = result["engine_busy"]
    stage, share = max(busy.items(), key=lambda kv: kv[1])
    if share >= 0.9:
        result["bound_by"] = stage
    else:
        why, most = max(result["disk_idle"].items(), key=lambda kv: kv[1])
        result["bound_by"] = f"{stage} {share:.0%} busy; disk idle most for: {why} ({most:.0%})"
    return result


def print_summary(cells: list[dict]) -> None:
    print("| setting | cache | mode | wall s | open s | disk busy | engine busy | consumer wait "
          "| disk idle: open / ring full / tail / other | bound by |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        a = c["analysis"]
        idle = " / ".join(f"{a['disk_idle'][k]:.2f}" for k in ("open", "ring full", "tail", "other"))
        engine = "-" if a["engine_busy"] is None else f"{a['engine_busy']:.2f}"
        print(f"| {c['setting']} | {c['cache']} | {c['mode']} | {a['wall_s']:.3f} | "
              f"{a['open_s']:.3f} | {a['disk_busy']:.2f} | {engine} | {a['consumer_wait']:.2f} | "
              f"{idle} | {a['bound_by']} |")


def plot(cells: list[dict], path: str) -> None:
    """One panel per cell: lanes for the reads (each read in its calls, by worker slot), the copy
    engine, the host's waits, and the staging ring's bytes in use; milliseconds from the open."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(cells), 1, figsize=(11, 2.2 * len(cells)), squeeze=False)
    for axis, cell in zip(axes[:, 0], cells):
        sample = cell["sample"]
        lo = sample["pass_start"]
        ms = lambda t: (t - lo) * 1e3  # noqa: E731
        events = sample["timeline"]
        # Reads stacked on as many lanes as they overlap (the worker count, roughly).
        lanes: list[float] = []
        bars: dict[int, list] = {}
        for e in sorted((e for e in events if e["kind"] == "read"), key=lambda e: e["start"]):
            lane = next((i for i, end in enumerate(lanes) if end <= e["start"]), len(lanes))
            if lane == len(lanes):
                lanes.append(0.0)
            lanes[lane] = e["end"]
            bars.setdefault(lane, []).append((ms(e["start"]), (e["end"] - e["start"]) * 1e3))
        labels = []
        y = 0
        for lane in sorted(bars):
            axis.broken_barh(bars[lane], (y, 0.8), color="tab:blue")
            labels.append(f"read {lane}")
            y += 1
        rows = [("copy engine", [(ms(s), (e - s) * 1e3) for s, e, _ in sample.get("engine_log") or []],
                 "tab:green"),
                ("copy queued", [(ms(e["start"]), 0.3) for e in events if e["kind"] == "copy_queued"],
                 "tab:olive"),
                ("consumer wait", [(ms(e["start"]), (e["end"] - e["start"]) * 1e3)
                                   for e in events if e["kind"] == "consumer_wait"], "tab:red"),
                ("copy wait", [(ms(e["start"]), (e["end"] - e["start"]) * 1e3)
                               for e in events if e["kind"] == "copy_wait"], "tab:purple"),
                ("open", [(ms(e["start"]), (e["end"] - e["start"]) * 1e3)
                          for e in events if e["kind"] == "open"], "tab:gray")]
        for label, spans, color in rows:
            axis.broken_barh(spans, (y, 0.8), color=color)
            labels.append(label)
            y += 1
        steps = _staging_steps(events)
        ring = sample.get("staging_bytes") or 0
        if steps and ring:
            axis.step([ms(t) for t, _ in steps], [y + 1.6 * u / ring for _, u in steps],
                      where="post", color="tab:orange", linewidth=0.8)
            labels.append("staging in use")
            y += 2
        axis.set_yticks([i + 0.4 for i in range(len(labels))])
        axis.set_yticklabels(labels, fontsize=6)
        axis.set_xlim(0, (sample["pass_end"] - lo) * 1e3)
        axis.set_title(f"{cell['setting']} {cell['cache']} {cell['mode']}: "
                       f"{cell['analysis']['bound_by']}", fontsize=8)
    axes[-1, 0].set_xlabel("ms since the open began")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
