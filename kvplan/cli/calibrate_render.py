"""`kvplan calibrate` for people: the verdict first (how close kvplan came), then each figure, within 80 columns.

Values from the log are printed as plain text, never as rich markup.
"""

from __future__ import annotations

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from kvplan.calibrate.compare import Component, Outcome, Report
from kvplan.calibrate.log import BLOCKS, BYTES, TIMES, TOKENS
from kvplan.engines import get_engine
from kvplan.units import GiB

_OUTCOME_WORDS = {"started": "it started", "kv_oom": "it stopped for lack of KV cache room",
                  "oom_other": "it ran out of memory after sizing the KV cache", "other_failure": "it failed",
                  "unknown": "the log ends before the KV cache was sized"}
_PROFILE_NAMES = (("total_memory_bytes", "GPU total"), ("non_torch_bytes", "non-torch"),
                  ("cuda_graph_bytes", "CUDA graphs"), ("weights_bytes", "weights"),
                  ("activation_peak_bytes", "activation peak"))


def _value(unit: str, value: float | None) -> str:
    if value is None:
        return "-"
    if unit == BYTES:
        return f"{value / GiB:,.2f} GiB"
    if unit in (TOKENS, BLOCKS):
        return f"{value:,.0f}"
    if unit == TIMES:
        return f"{value:,.2f}x"
    return f"{value:g}"


def _pct(x: float | None) -> str:
    if x is None:
        return ""
    return "0.0%" if abs(x) < 0.0005 else f"{x:+.1%}"


def _outcome_text(o: Outcome) -> str:
    logged = _OUTCOME_WORDS.get(o.logged, o.logged)
    said = "" if o.predicted is None else f"; kvplan says {o.predicted}"
    if o.right is None:
        return f"Start-up: {logged}{said}."
    return f"Start-up called {'right' if o.right else 'WRONG'}: {logged}{said}."


def verdict(r: Report) -> Text:
    log, d = r.log, r.deployment
    label = get_engine(log.engine).label
    who = f"{label} {r.version_label or '(release not printed)'} log"
    if d is not None:
        who += f", {d.model.name} on {d.gpu.key} (tp {d.parallelism.tp}"
        who += f", pp {d.parallelism.pp})" if d.parallelism.pp > 1 else ")"
    h = r.headline
    if h is None or h.logged is None:
        why = r.unpredicted or "no figure kvplan predicts was printed"
        text = Text(f"{who}: read {log.figures} figures; no comparison: {why}. ")
        text.append(_outcome_text(r.outcome))
        return text
    rel = h.relative(h.predicted)
    text = Text(f"{who}: {h.label} {_value(h.unit, h.logged.value)} logged, kvplan "
                f"{_value(h.unit, h.predicted)} ({_pct(rel)})")
    if h.replayed is not None:
        text.append(f"; with this box's profile {_value(h.unit, h.replayed)} ({_pct(h.relative(h.replayed))})")
    text.append(". " + _outcome_text(r.outcome))
    return text


def _table(r: Report) -> Table:
    t = Table(box=None, pad_edge=False)
    for col, right in (("figure", False), ("logged", True), ("kvplan", True), ("diff", True), ("profile", True)):
        t.add_column(col, justify="right" if right else "left", no_wrap=True)
    for c in r.components:
        if c.logged is None and c.predicted is None:
            continue
        t.add_row(c.label, _value(c.unit, None if c.logged is None else c.logged.value), _value(c.unit, c.predicted),
                  _pct(c.relative(c.predicted)), _pct(c.relative(c.replayed)))
    return t


def _differs(c: Component) -> str | None:
    if c.logged is None:
        return None
    if c.predicted is None:
        return f"{c.label}: logged {_value(c.unit, c.logged.value)} (line {c.logged.line}); " + (
            c.note or "kvplan predicts none")
    if not c.differs(c.predicted):
        return None
    return (f"{c.label}: kvplan {_value(c.unit, c.predicted)}, logged {_value(c.unit, c.logged.value)} "
            f"(line {c.logged.line}, {_pct(c.relative(c.predicted))})")


def _ranks(r: Report) -> Table | None:
    ranks = r.log.ranks
    if len(ranks) < 2:
        return None
    keys = [k for k in ("weights", "available_kv", "free_after_load", "pool_tokens", "cuda_graph_actual")
            if any(rk.get(k) for rk in ranks)]
    if not keys:
        return None
    t = Table(box=None, pad_edge=False)
    t.add_column("rank", no_wrap=True)
    for k in keys:
        t.add_column(k.replace("_", " "), justify="right", no_wrap=True)
    for rk in ranks:
        row = [rk.rank]
        for k in keys:
            got = rk.get(k)
            row.append("-" if got is None else _value(got.unit, got.value))
        t.add_row(*row)
    return t


def _profile_lines(r: Report) -> list[str]:
    p = r.profile
    if p is None:
        return []
    out = []
    for field, name in _PROFILE_NAMES:
        value = getattr(p, field)
        if value is not None:
            out.append(f"{name} {value / GiB:,.2f} GiB ({r.provenance.get(field, 'measured')})")
    return out


def render_report(r: Report, saved: str | None, console: Console) -> None:
    console.print(verdict(r))
    console.print()
    table = _table(r)
    if table.row_count:
        console.print(Text("Measured and predicted, per GPU (the first rank):", style="bold"))
        console.print(Padding(table, (0, 0, 0, 2)))
    lines = [x for x in (_differs(c) for c in r.components) if x] if r.verdict is not None else []
    if lines:
        console.print(Text("Where they differ (beyond 0.5% and the log's rounding):", style="bold"))
        for line in lines:
            console.print(Padding(Text(f"- {line}"), (0, 0, 0, 2)))
    if r.settings:
        console.print(Text("Settings the engine chose, and kvplan's default rule for them:", style="bold"))
        for s in r.settings:
            default = "-" if s.kvplan_default is None else f"{s.kvplan_default:g}"
            mark = "" if s.kvplan_default is not None and abs(s.kvplan_default - s.logged) < 1e-9 else " (differs)"
            console.print(Padding(Text(f"- {s.name}: {s.logged:g} logged, kvplan {default}{mark}"), (0, 0, 0, 2)))
    ranks = _ranks(r)
    if ranks is not None:
        console.print(Text("Per rank:", style="bold"))
        console.print(Padding(ranks, (0, 0, 0, 2)))
    profile = _profile_lines(r)
    if profile:
        head = f"Profile saved to {saved}:" if saved else "Profile of this box (--save writes it):"
        console.print(Text(head, style="bold"))
        for line in profile:
            console.print(Padding(Text(f"- {line}"), (0, 0, 0, 2)))
        if saved and r.deployment is not None:
            console.print(Padding(Text(f"Plan on this box: kvplan estimate MODEL --profile {saved}"), (0, 0, 0, 2)))
    if r.log.error:
        console.print(Text("The log's error:", style="bold"))
        console.print(Padding(Text(r.log.error), (0, 0, 0, 2)))
    cal = r.verdict.account.calibration if r.verdict is not None else None
    notes = list(r.notes)
    if cal is not None and not cal.in_range:
        notes.append(f"outside kvplan's calibration ({cal.checked_on}): {'; '.join(cal.outside)}")
    if notes:
        console.print(Text("Notes:", style="bold"))
        for note in notes:
            console.print(Padding(Text(f"- {note}"), (0, 0, 0, 2)))


def render_reports(reports: list[Report], saved: str | None, console: Console) -> None:
    for i, r in enumerate(reports):
        if i:
            console.print()
        if len(reports) > 1:
            console.print(Text(f"== {r.log.source}", style="bold"))
        render_report(r, saved, console)
