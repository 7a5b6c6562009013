"""PNG plots of a `python -m kvlab bench` record (pure rendering, matplotlib Agg).

Every function takes the JSON-ready record the bench builds and a folder, and
returns the paths it wrote. Points are medians; error bars span min to max over
the repeats. This module draws; it does not measure.
"""

from __future__ import annotations

from pathlib import Path

FIGSIZE = (7.0, 4.2)
DPI = 110


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot(1, 1, 1)


def _save(figure, folder: Path, name: str) -> Path:
    path = folder / name
    figure.tight_layout()
    figure.savefig(path)
    return path


def _errors(stats: list[dict]) -> list[list[float]]:
    """Asymmetric error bars (below, above the median) from stats dicts."""
    return [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]


def _bars(axes, labels: list[str], groups: dict[str, list[dict]], ylabel: str) -> None:
    """Grouped bars: one group per label, one bar per series in `groups`."""
    width = 0.8 / max(len(groups), 1)
    for k, (series, stats) in enumerate(groups.items()):
        xs = [i + (k - (len(groups) - 1) / 2) * width for i in range(len(labels))]
        axes.bar(xs, [s["median"] for s in stats], width, yerr=_errors(stats), capsize=3, label=series)
    axes.set_xticks(range(len(labels)))
    axes.set_xticklabels(labels, fontsize=8)
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=8)


def plot_overhead(section: dict, folder: Path) -> list[Path]:
    rows = section["rows"]
    figure, axes = _figure()
    _bars(axes, [r["strategy"] for r in rows],
          {"bare model.generate": [r["bare_tok_s"] for r in rows], "kvlab runner": [r["kvlab_tok_s"] for r in rows]},
          "tokens / s (end to end, higher is better)")
    axes.set_title(f"Overhead: kvlab runner vs bare generate, {section['new_tokens']} new tokens")
    return [_save(figure, folder, "overhead.png")]


def plot_fair(section: dict, folder: Path) -> list[Path]:
    rows = section["rows"]
    low, high = section["band"]
    figure, axes = _figure()
    stats = [r["ratio"] for r in rows]
    axes.axhspan(low, high, color="tab:green", alpha=0.15, label=f"target {low}–{high}")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.errorbar(range(len(rows)), [s["median"] for s in stats], yerr=_errors(stats), fmt="o", capsize=4,
                  label="together / alone")
    axes.set_xticks(range(len(rows)))
    axes.set_xticklabels([r["strategy"] for r in rows], fontsize=8)
    axes.set_ylabel("median per-token latency ratio")
    axes.set_title(f"Fair mode: {len(rows)} columns together vs each alone")
    axes.legend(fontsize=8)
    return [_save(figure, folder, "fair.png")]


def plot_parallel(section: dict, folder: Path) -> list[Path]:
    rows = section["rows"]
    figure, axes = _figure()
    _bars(axes, [r["mode"] for r in rows], {"wall time": [r["elapsed_s"] for r in rows]}, "seconds for all 4 columns")
    ratio = section["ratio"]
    axes.set_title(f"Parallel vs sequential, 4 columns: ratio {ratio['median']:.2f} (target ≤ {section['target']})")
    return [_save(figure, folder, "parallel.png")]


def plot_scaling(section: dict, folder: Path) -> list[Path]:
    lengths = section["lengths"]
    paths = []
    for key, ylabel, name, title in (
        ("latency_ms", "median per-token latency (ms)", "scaling_latency.png", "Per-token latency vs context length"),
        ("cache_bytes", "cache tensor bytes (MiB)", "scaling_bytes.png", "Cache bytes vs context length"),
    ):
        figure, axes = _figure()
        scale = 1 / 2**20 if key == "cache_bytes" else 1.0
        for label, series in section["series"].items():
            stats = series[key]
            points = [(n, s) for n, s in zip(lengths, stats) if s is not None]
            if not points:
                continue
            xs = [n for n, _ in points]
            medians = [s["median"] * scale for _, s in points]
            errors = [[(s["median"] - s["min"]) * scale for _, s in points], [(s["max"] - s["median"]) * scale for _, s in points]]
            # Dashed and hollow markers so a series lying on another (static on dynamic) stays visible.
            style = {"linestyle": "--", "markerfacecolor": "none"} if label == "static" else {}
            axes.errorbar(xs, medians, yerr=errors, marker="o", capsize=3, label=label, **style)
        axes.set_xscale("log", base=2)
        if key == "latency_ms":
            # no_cache grows to seconds; a log axis keeps the milliseconds of the others readable.
            axes.set_yscale("log")
        axes.set_xticks(lengths)
        axes.set_xticklabels([str(n) for n in lengths])
        axes.set_xlabel("context length (prompt tokens)")
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        axes.legend(fontsize=8)
        paths.append(_save(figure, folder, name))
    return paths


def plot_startup(section: dict, folder: Path) -> list[Path]:
    launches = [name for name in ("first", "second") if "ready_s" in section.get(name, {})]
    labels = [f"{name} launch (backend)" for name in launches]
    ready = [section[n]["ready_s"] for n in launches]
    second = [section[n]["first_token_s"] for n in launches]
    if "app_second" in section:
        labels.append("second launch (app.py)")
        ready.append(section["app_second"]["ready_s"])
        second.append(section["app_second"]["served_s"])
    figure, axes = _figure()
    if labels:
        _bars(axes, labels, {"to model ready": ready, "to first token (backend) / page served (app)": second},
              "seconds from process start")
    axes.axhline(section["target_ready_s"], color="tab:red", linestyle="--", linewidth=0.8)
    axes.set_title(f"Start-up (target: second launch ready ≤ {section['target_ready_s']} s, red line)")
    return [_save(figure, folder, "startup.png")]


def plot_roofline(section: dict, folder: Path) -> list[Path]:
    variants = section["variants"]
    figure, axes = _figure()
    labels = [v["name"] for v in variants]
    _bars(axes, labels, {"measured decode": [v["tok_s"] for v in variants]}, "decode tokens / s")
    axes.scatter(range(len(variants)), [v["bound_tok_s"] for v in variants], marker="_", s=600, color="tab:red",
                 label="bandwidth bound", zorder=3)
    axes.legend(fontsize=8)
    for label in axes.get_xticklabels():
        label.set_rotation(15)
    axes.set_title("Decode speed vs the memory-bandwidth bound")
    return [_save(figure, folder, "roofline.png")]


def plot_plan(section: dict, folder: Path) -> list[Path]:
    seconds = section["plan_s"]["values"]
    figure, axes = _figure()
    labels = ["first"] + [f"repeat {i + 1}" for i in range(1, len(seconds))]
    axes.bar(range(len(seconds)), seconds, color=["tab:orange"] + ["tab:blue"] * (len(seconds) - 1))
    axes.set_xticks(range(len(seconds)))
    axes.set_xticklabels(labels, fontsize=8)
    axes.axhline(section["target_s"], color="tab:red", linestyle="--", linewidth=0.8)
    axes.set_ylabel("seconds per plan (after the warm-up)")
    axes.set_title(f"Plan: {section['model'].split('/')[-1]}, {len(section['strategies'])} strategies × "
                   f"{len(section['contexts'])} contexts (target, red line)")
    return [_save(figure, folder, "plan.png")]


PLOTTERS = {
    "overhead": plot_overhead,
    "fair": plot_fair,
    "parallel": plot_parallel,
    "scaling": plot_scaling,
    "startup": plot_startup,
    "roofline": plot_roofline,
    "plan": plot_plan,
}


def draw_all(record: dict, folder: str | Path) -> list[Path]:
    """Draw one or two PNGs per measured section of `record` into `folder`; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, section in record["sections"].items():
        if name in PLOTTERS and "error" not in section:
            paths.extend(PLOTTERS[name](section, folder))
    return paths
