"""Text of a `python -m kvlab bench` record: the printed report and the Markdown table for the README.

Pure functions of the JSON-ready record the bench builds: per-section figure
lines (median [min–max]), the checks table (`check_rows`, `status_of`), the
machine line. This module formats; it measures nothing and draws nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from .harness import EXTRA_SECTIONS
from .needle import needle_lines
from .report import report_lines

HEADERS = ["section", "check", "median [min–max]", "target", "status"]
LABEL_WIDTH = 16
VARIANT_WIDTH = 28


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def _spread(stats: dict | None, unit: str = "", scale: float = 1.0) -> str:
    if not stats:
        return "—"
    return (f"{_num(stats['median'] * scale, unit)} "
            f"[{_num(stats['min'] * scale)}–{_num(stats['max'] * scale)}]")


def status_of(check: dict) -> str:
    """`met`, `MISSED (reason)`, `reported` (no target) or `n/a (reason)` (not judged)."""
    if check["met"] is True:
        return "met"
    if check["met"] is False:
        return f"MISSED ({check['reason']})"
    return f"n/a ({check['reason']})" if check["value"] is None else "reported"


def check_rows(record: dict) -> list[list[str]]:
    """One row per check: section, name, median [min–max] (seconds marked `s`, memory `MB`), target, status."""
    rows = []
    for check in record["checks"]:
        unit = check["unit"] if check["unit"] in ("s", "MB") else ""
        value = _num(check["value"], unit)
        if check["min"] is not None:
            value += f" [{_num(check['min'])}–{_num(check['max'])}]"
        rows.append([check["section"], check["name"], value, check["target"], status_of(check)])
    return rows


def _skipped(section: dict) -> list[str]:
    return [f"  {s['strategy']:<{LABEL_WIDTH}} skipped: {s['reason']}" for s in section.get("skipped_strategies", [])]


def overhead_lines(s: dict) -> list[str]:
    lines = [f"overhead ({s['new_tokens']} new tokens, {s['prompt_tokens']}-token prompt, tok/s):"]
    for r in s["rows"]:
        lines.append(f"  {r['strategy']:<{LABEL_WIDTH}} bare {_spread(r['bare_tok_s'])}  "
                     f"kvlab {_spread(r['kvlab_tok_s'])}  "
                     f"kvlab outside forward {_spread(r['kvlab_outside_forward_ms_per_token'], 'ms/token')}")
    return lines + _skipped(s)


def fair_lines(s: dict) -> list[str]:
    lines = ["fair (median per-token latency, ms):"]
    for r in s["rows"]:
        lines.append(f"  {r['strategy']:<{LABEL_WIDTH}} together {_spread(r['together_ms'])}  "
                     f"alone {_spread(r['alone_ms'])}")
    return lines + _skipped(s)


def parallel_lines(s: dict) -> list[str]:
    lines = ["parallel (wall time for 4 columns, s; cores busy):"]
    for r in s["rows"]:
        lines.append(f"  {r['mode']:<{LABEL_WIDTH}} {_spread(r['elapsed_s'])}  cores {_spread(r['cores_busy'])}")
    return lines


def scaling_lines(s: dict) -> list[str]:
    lines = ["scaling (per-token latency ms | cache MiB) at " + ", ".join(map(str, s["lengths"])) + " tokens:"]
    for label, series in s["series"].items():
        lat = " ".join(_num(x["median"]) if x else "—" for x in series["latency_ms"])
        mib = " ".join(_num(x["median"] / 2**20) if x else "—" for x in series["cache_bytes"])
        error = f"  ({series['error']})" if "error" in series else ""
        lines.append(f"  {label:<{LABEL_WIDTH}} {lat} | {mib}{error}")
    return lines


def startup_lines(s: dict) -> list[str]:
    lines = ["startup (s from process start):"]
    for name in ("first", "second"):
        part = s.get(name, {})
        if "ready_s" in part:
            lines.append(f"  {name:<{LABEL_WIDTH}} imports {_spread(part['imports_s'])}  lazy imports done "
                         f"{_spread(part['lazy_imports_s'])}  ready {_spread(part['ready_s'])}  "
                         f"first token {_spread(part['first_token_s'])}")
        else:
            lines.append(f"  {name:<{LABEL_WIDTH}} {part.get('skipped', '—')}")
    app = s.get("app_second")
    if app:
        lines.append(f"  {'app.py second':<{LABEL_WIDTH}} page served {_spread(app['served_s'])}  model ready "
                     f"{_spread(app['ready_s'])}  (import gradio alone {_spread(s['gradio_import_s'])})")
    return lines


def roofline_lines(s: dict) -> list[str]:
    copies = ", ".join(f"{k} {v['median']:.1f}" for k, v in s["copy_bandwidth_gb_s"].items())
    lines = [f"roofline (copy bandwidth {s['bandwidth_gb_s']:.1f} GB/s read+write, {s['bandwidth_from']}; "
             f"medians: {copies}):"]
    for r in s["variants"]:
        lines.append(f"  {r['name']:<{VARIANT_WIDTH}} {_spread(r['tok_s'], 'tok/s')}  "
                     f"bound {_num(r['bound_tok_s'], 'tok/s')}  = {_spread(r['fraction'])}")
    for r in s.get("skipped_variants", []):
        lines.append(f"  {r['name']:<{VARIANT_WIDTH}} skipped: {r['reason']}")
    return lines


def plan_lines(s: dict) -> list[str]:
    lines = [f"plan ({s['model']}, {len(s['strategies'])} strategies × {len(s['contexts'])} contexts, "
             f"{s['budget_gib']} GiB budget; s per plan):",
             f"  {'warm-up':<{LABEL_WIDTH}} {_num(s['warm_up_s'], 's')}  first plan {_num(s['first_plan_s'], 's')}  "
             f"every plan {_spread(s['plan_s'], 's')}"]
    models = s.get("models") or {}
    width = max([len(model.split("/")[-1]) for model in models] + [LABEL_WIDTH])
    for model, times in models.items():
        lines.append(f"  {model.split('/')[-1]:<{width}} first plan {_num(times['first_s'], 's')}  "
                     f"other contexts {_num(times['other_contexts_s'], 's')}  "
                     f"first contexts again {_num(times['again_s'], 's')}")
    if "rss_peak_extra_bytes" in s:
        lines.append(f"  {'peak extra RSS':<{LABEL_WIDTH}} {_num(s['rss_peak_extra_bytes'] / 1e6, 'MB')} over the "
                     f"warm-up and plans, {_num(s['rss_peak_extra_plans_only_bytes'] / 1e6, 'MB')} over the plans "
                     f"alone ({s['memory_method']})")
    return lines


def e2e_lines(s: dict) -> list[str]:
    """Bare transformers' seconds, then per condition kvlab's seconds and kvlab / bare (median [min–max])."""
    lines = [f"e2e ({s['preset']}, {len(s['columns'])} columns one after another, {s['new_tokens']} new tokens; "
             f"Run to summary / bare transformers):",
             f"  {'bare':<{VARIANT_WIDTH}} {_spread(s['bare_s'], 's')}"]
    for name, cond in s["conditions"].items():
        line = f"  {name:<{VARIANT_WIDTH}} {_spread(cond['seconds'], 's')}  ratio {_spread(cond['ratio'])}"
        if "done_seconds" in cond and name != "no fidelity":
            line += f"  · fidelity filled in {_spread(cond['done_seconds'], 's')}  ratio {_spread(cond['done_ratio'])}"
        lines.append(line)
    if "first_run" in s:
        first = s["first_run"]
        lines.append(f"  {'first Run':<{VARIANT_WIDTH}} {_num(first['seconds'], 's')}  ratio "
                     f"{_num(first['ratio'], '')} (one-time warm-up included, against the warm bare median)")
    return lines


DETAILS: dict[str, tuple[str, Callable[[dict], list[str]]]] = {
    "overhead": ("rows", overhead_lines),
    "fair": ("rows", fair_lines),
    "parallel": ("rows", parallel_lines),
    "scaling": ("series", scaling_lines),
    "startup": ("checks", startup_lines),
    "roofline": ("variants", roofline_lines),
    "plan": ("plan_s", plan_lines),
    "e2e": ("conditions", e2e_lines),
    "needle": ("ratio", needle_lines),
    "report": ("ratio", report_lines),
}
"""Section -> (the key that says it has figures, the function writing its lines)."""


def detail_lines(record: dict) -> list[str]:
    """Per-section figures behind the checks (median [min–max]), then the sections that did not run."""
    lines = []
    sections = record["sections"]
    details = {**DETAILS, **{name: extra.details for name, extra in EXTRA_SECTIONS.items() if extra.details}}
    for name, (key, write) in details.items():
        section = sections.get(name)
        if section is not None and key in section and "error" not in section:
            lines.extend(write(section))
    for name, section in sections.items():
        if "error" in section:
            lines.append(f"{name}: did not run: {section['error']}")
    return lines


def machine_line(record: dict) -> str:
    """CPU, cores, memory (GiB), platform, library versions, threads and the load average at start."""
    m = record["machine"]
    load = record.get("load_average_start")
    return (f"{m['cpu']}, {m['cores_available']} cores, {m['memory_bytes'] / 2**30:.0f} GiB, {m['platform']}; "
            f"torch {m['torch']} ({m['torch_threads']} threads), transformers {m['transformers']}"
            + (f"; load average at start {load[0]:.2f}" if load else ""))


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines)


def format_report(record: dict) -> str:
    """The printed report: machine, per-section figures, then the checks table."""
    size = record["size"]
    head = (f"kvlab bench, size {size['name']} ({size['repeats']} repeats), {record['elapsed_s']:.0f} s; "
            f"{record['model']['name']} {record['model']['dtype']} on {record['model']['device']}")
    return "\n".join([head, machine_line(record), "", *detail_lines(record), "",
                      format_table(HEADERS, check_rows(record))])


def format_markdown(record: dict) -> str:
    """The checks table as Markdown, with the machine it came from (for the README)."""
    rows = [[cell.replace("|", "\\|") for cell in row] for row in check_rows(record)]
    command = record.get("command") or f"python -m kvlab bench --size {record['size']['name']}"
    lines = [f"Measured {record['started']} with `{command}` on "
             f"{machine_line(record)}.", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines) + "\n"
