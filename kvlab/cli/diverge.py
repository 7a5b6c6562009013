"""`python -m kvlab diverge`: step a lossy strategy (or a decode-loop mistake) beside a dense reference and record,
per step and per layer, where the two runs part (`kvlab.inspect.diverge_run.DivergeRequest`, the path the `diverge`
agent tool takes too).

`diverge --strategy quantized:backend=quanto:nbits=2 --reference dynamic --prompt "..." --steps 20 --json OUT`
prints one line per step (token, reference's top-1, KL, first layers with KV error / attention lost / drift,
the cache's length against the tokens seen) and writes every `DivergeStep` record. `--strategy` also takes a
loop variant from `kvlab.inspect.loops.LOOP_VARIANTS` (`loop:full_sequence`, `loop:positions_from_zero`).
Bad input prints the reason on stderr and exits with status 2, before any model is loaded.
"""

from __future__ import annotations

import sys

from ..inspect.diverge import MAX_DIVERGE_STEPS, first_layer_with
from ..inspect.diverge_run import DEFAULT_STEPS, DivergeRequest, diverge_record
from .common import WEIGHTS_DEFAULTS, model_defaults
from .stepped import open_session, print_steps, write_record


def add_parser(subparsers, parents) -> None:
    """Add the `diverge` subcommand; `parents` holds the shared `--model/--dtype/--device` parent."""
    p = subparsers.add_parser("diverge", parents=list(parents),
                              help="step a lossy cache beside a dense reference and show where, layer by layer, "
                                   "they part")
    p.add_argument("--strategy", required=True,
                   help="the strategy under study, knobs after colons (quantized:backend=quanto:nbits=2, "
                        "sink:window_length=64), or a loop mistake: loop:full_sequence | loop:positions_from_zero")
    p.add_argument("--reference", default="dynamic", help="an exact strategy to compare with (default dynamic)")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--system", default="", help="system prompt for chat models")
    p.add_argument("--plain", action="store_true", help="tokenize the prompt as plain text, without the chat template")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"tokens to generate, one lockstep step each (1..{MAX_DIVERGE_STEPS}, default {DEFAULT_STEPS})")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--json", help="write the per-step, per-layer records to this file")
    model_defaults(p, WEIGHTS_DEFAULTS)
    p.set_defaults(func=run)


def step_line(record) -> str:
    """One printed line per step."""
    def first(name):
        layer = first_layer_with(record, name)
        return "-" if layer is None else str(layer)

    mark = "" if record.top1_agrees else "  << top-1 differs"
    return (f"{record.index:>4} {record.token_text!r:<14} ref {record.reference_top[0].text!r:<12} "
            f"KL {record.kl_nats:.4f}  first layer: kv {first('kv_error')} lost {first('attention_lost')} "
            f"drift {first('hidden_rel_l2')} lens {'-' if record.lens_diverged_from is None else record.lens_diverged_from}"
            f"  cache {record.cache_length}/{record.seen_tokens} tokens{mark}")


def request(args) -> DivergeRequest:
    """The diverge request the flags spell."""
    return DivergeRequest(strategy=args.strategy, prompt=args.prompt, steps=args.steps, reference=args.reference,
                          system=args.system, chat=not args.plain, stop_at_eos=not args.ignore_eos, flag_prefix="--")


def _session(args):
    """(loaded model, DivergeSession). Raises ValueError (StrategyError, InspectError) or ModelLoadError."""
    from ..models.loading import ModelSpec, load_model
    from .outputs import check_writable

    asked = request(args)
    asked.check()
    check_writable(args.json)
    loaded = load_model(ModelSpec(args.model, args.dtype, args.device),
                        progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
    return loaded, asked.session(loaded)


def run(args) -> int:
    """Run the `diverge` subcommand; returns the exit status."""
    opened = open_session("kvlab diverge", lambda: _session(args))
    if isinstance(opened, int):
        return opened
    loaded, session = opened
    explanation = getattr(session.strategy, "explanation", "")
    if explanation:
        print(f"{session.strategy.describe()}: {explanation}")
    print_steps("kvlab diverge", session, args.steps, step_line)
    first = session.first_divergence
    print(f"{len(session.records)} steps; {session.strategy.describe()} vs {session.reference.describe()}: "
          f"first divergence {'none' if first is None else f'at step {first}'}")
    record = diverge_record(session, request(args).prompt_json(), loaded.info()) if args.json else {}
    return write_record("kvlab diverge", args.json, record)
