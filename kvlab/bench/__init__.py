"""`python -m kvlab bench`: is the instrument honest, and what does it cost?

Ten sections, most of them measured side by side in one run with their
comparison runs interleaved (A, B, A, B... with the order alternating), so
machine noise hits both sides; every figure is the median over the repeats with
min–max beside it:

- `overhead`: tok/s of kvlab's runner (one column, events streamed and consumed)
  vs bare `model.generate` with a fresh cache of the same strategy.
- `fair`: median per-token latency of 4 strategies run together in fair mode vs
  each alone.
- `parallel`: wall time of 4 columns in parallel mode vs the same 4 sequentially,
  and the same comparison for bare `generate` calls with one torch thread each.
- `scaling`: cache bytes and per-token latency vs context length per strategy.
- `startup`: process start to model ready and to first token, in a subprocess,
  on a fresh cache folder (first launch) and on the same folder again; and
  `python app.py` itself, from spawn to its page answering and its model ready.
- `roofline`: decode tok/s vs the memory-bandwidth bound measured here (weight
  bytes read per token over large-tensor copy bandwidth), and the levers kvlab
  controls (threads, static cache, torch.compile, bf16).
- `plan`: seconds per plan of one catalog model (6 strategies × 5 contexts)
  after the planner's warm-up, as the Plan tab runs it, and the peak RSS the
  warm-up and plans add (the kernel's high-water mark).
- `e2e`: from Run to the finished summary, the quickstart preset's columns
  through kvlab (default, each other timing policy, no fidelity) over bare transformers
  generating the same columns one after another.
- `needle`: the needle grid against bare `generate()` doing the same cells.
- `report`: the quality report (`kvlab report`) against a bare transformers loop
  scoring the same tokens through the same caches.
The repository's `benchmarks/` adds an `app` section (`python -m benchmarks
--only app`: the app through its API and a headless browser against the CLI),
kept out of the installed package.

Strategies are resolved through kvlab's registry, so `--strategies` can put any
registered strategy in the overhead, fair and scaling sections. Timed model work
always runs on kvlab's compute thread (`kvlab.compute`), kvlab's runner and the
bare baseline alike, and the bench runs no torch work in its main thread: a
second thread doing OpenMP work makes GNU OpenMP park idle threads instead of
letting them spin, which slowed decoding about 1.8× here. Each check prints
`met`, `MISSED (reason)` with the reason measured in the same run, `reported`
where the issue sets no target, or `n/a (reason)` where it cannot be judged.
No assertion is made on a time and the exit status is 0 whenever the bench ran.

Modules: `harness` (sizes, figures, checks, timed runs), `strategy_sets`, one
module per section (`overhead`, `fair`, `parallel`, `scaling`, `startup`,
`roofline`, with `profiling`; `planning` for `plan`; `e2e`), the child programs
`startup_child` and `import_time_child`, `suite` (one whole run), `text`
(report and Markdown), `plots` (matplotlib), `cli` (flags). Measuring is apart from rendering; nothing
here imports gradio or a browser driver.
"""

from .cli import add_parser, check_outputs, cmd_bench, parse_only
from .harness import RECORD_VERSION, SECTIONS, SIZES, BenchSize, make_check, register_section, summarize
from .suite import add_bandwidth_floor, run_bench
from .text import format_markdown, format_report, status_of

__all__ = ["RECORD_VERSION", "SECTIONS", "SIZES", "BenchSize", "add_bandwidth_floor", "add_parser", "check_outputs",
           "cmd_bench", "format_markdown", "format_report", "make_check", "parse_only", "register_section", "run_bench",
           "status_of",
           "summarize"]
