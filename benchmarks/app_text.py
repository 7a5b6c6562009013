"""Text of the app section (`benchmarks.app_section`): per path and run, app / CLI of each column's figures.
Pure functions of the section's record; this module formats and measures nothing."""

from __future__ import annotations

from kvlab.bench.text import VARIANT_WIDTH, _num

from .app_section import RUNS


def _ratio_text(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def app_lines(s: dict) -> list[str]:
    """Per path and run, one line per column: app / CLI of decode tok/s and TTFT (summary figures), live decode."""
    tokens = s["new_tokens"] or "the preset's"
    app_runs = sum(run in RUNS for runs in s["paths"].values() for run in runs)
    cli_runs = len(s["cli_timing"])
    around = "the mean of the CLI runs just before and just after each app run" if cli_runs > app_runs else \
        f"the mean of {cli_runs} CLI run{'s' if cli_runs != 1 else ''}"
    lines = [f"app ({s['preset']}, {tokens} new tokens; app / CLI fair, CLI = {around}; {s['browser_here']}):"]
    repeat = s.get("cli_repeat_decode_ratio") or []
    if repeat:
        lines.append(f"  CLI run / the CLI run before it, decode tok/s: {min(repeat):.2f}–{max(repeat):.2f} "
                     "(the noise floor)")
    for path, runs in s["paths"].items():
        if "skipped" in runs:
            lines.append(f"  {path}: skipped: {runs['skipped']}")
            continue
        for run, comparison in runs.items():
            timing = comparison["timing"]
            load = timing.get("load_average")
            lines.append(f"  {path}, {run} run after start (load average {_num(load)}"
                         f"{', busy' if timing.get('busy') else ''}):")
            for c in comparison["columns"]:
                if "app_status" in c:
                    lines.append(f"    {c['column']:<{VARIANT_WIDTH}} no figures in the app run ({c['app_status']})")
                    continue
                lines.append(f"    {c['column']:<{VARIANT_WIDTH}} decode {_num(c['app_decode_tok_s'])} / "
                             f"{_num(c['cli_decode_tok_s'])} tok/s = {_ratio_text(c['decode_ratio'])}  "
                             f"TTFT {_ratio_text(c['ttft_ratio'])}  live decode {_ratio_text(c['live_decode_ratio'])}")
            flips = "; ".join(" vs ".join(pair) for pair in comparison["raw_flips"]) or "none"
            lines.append(f"    rank flips: {flips} ({len(comparison['flips'])} beyond noise)")
            cpu = comparison.get("cpu")
            if cpu:
                lines.append(f"    cores used during the run ({cpu['wall_s']:.0f} s): app {_num(cpu['app'])}, browser "
                             f"{_num(cpu['browser'])}, bench {_num(cpu['bench'])}, rest of the machine {_num(cpu['rest'])}")
        idle = (s.get("between_cpu") or {}).get(path)
        if idle:
            lines.append(f"    the CLI run between the two ({idle['wall_s']:.0f} s) shared the cores with the idle app "
                         f"{_num(idle['app'])} and browser {_num(idle['browser'])}")
    return lines
