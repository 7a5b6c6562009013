"""`python -m kvlab diverge`: step a lossy strategy (or a decode-loop mistake) beside a dense reference and record,
per step and per layer, where the two runs part (`kvlab.inspect.diverge.DivergeSession`).

`diverge --strategy quantized:backend=quanto:nbits=2 --reference dynamic --prompt "..." --steps 20 --json OUT`
prints one line per step (token, reference's top-1, KL, first layers with KV error / attention lost / drift,
the cache's length against the tokens seen) and writes every `DivergeStep` record. `--strategy` also takes a
loop variant from `kvlab.inspect.loops.LOOP_VARIANTS` (`loop:full_sequence`, `loop:positions_from_zero`).
Bad input prints the reason on stderr and exits with status 2, before any model is loaded.
"""

from __future__ import annotations

import sys

from ..inspect.diverge import MAX_DIVERGE_STEPS, first_layer_with
from .common import WEIGHTS_DEFAULTS, model_defaults
from .stepped import open_session, print_steps, write_record

DEFAULT_STEPS = 16


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


def parse_strategy(text: str):
    """A registered strategy or a loop variant from its command-line spelling. Raises ValueError (StrategyError)."""
    from ..strategies import make_strategy
    from ..strategies.base import parse_strategy_item
    from ..inspect.loops import LOOP_VARIANTS

    from ..strategies import StrategyError

    text = text.strip()
    if text in LOOP_VARIANTS:
        return LOOP_VARIANTS[text]()
    loop = next((name for name in LOOP_VARIANTS if text.startswith(name + ":")), None)
    if loop is not None:
        raise StrategyError(f"{loop} takes no knobs (got {text[len(loop) + 1:]!r}): a loop mistake always runs on "
                            f"a dynamic cache; write {loop} alone")
    if text.startswith("loop:"):
        raise StrategyError(f"unknown loop mistake {text!r}: choose {' or '.join(LOOP_VARIANTS)}")
    return make_strategy(parse_strategy_item(text))


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


def document(session, prompt: dict, model_info: dict) -> dict:
    """The JSON the command writes: settings, tokens, first divergence, every step's record."""
    return {"model": model_info, "strategy": session.strategy.describe(), "reference": session.reference.describe(),
            "explanation": getattr(session.strategy, "explanation", ""), "prompt": prompt,
            "prompt_tokens": session.prompt_ids.shape[1], "token_ids": session.token_ids,
            "first_divergence": session.first_divergence, "steps": [r.to_json() for r in session.records]}


def _session(args):
    """(loaded model, DivergeSession). Raises ValueError (StrategyError, InspectError) or ModelLoadError."""
    from ..generation import GenerationSettings, encode_prompt
    from ..models.loading import ModelSpec, load_model
    from ..inspect.diverge import DivergeSession
    from .outputs import check_writable

    if not args.prompt.strip():
        raise ValueError("the prompt is empty: type something to generate from")
    if not 1 <= args.steps <= MAX_DIVERGE_STEPS:
        raise ValueError(f"--steps must be from 1 to {MAX_DIVERGE_STEPS}, got {args.steps}")
    strategy, reference = parse_strategy(args.strategy), parse_strategy(args.reference)
    if reference.lossy or not reference.use_cache:
        raise ValueError(f"--reference must be an exact cache (dynamic, static), got {reference.describe()}")
    settings = GenerationSettings(max_new_tokens=args.steps, stop_at_eos=not args.ignore_eos, fidelity=False)
    settings.check()
    check_writable(args.json)
    loaded = load_model(ModelSpec(args.model, args.dtype, args.device),
                        progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
    prompt_ids = encode_prompt(loaded.tokenizer, args.prompt, args.system, not args.plain)
    return loaded, DivergeSession(loaded, strategy, prompt_ids, settings, reference)


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
    prompt = {"text": args.prompt, "system": args.system, "chat": not args.plain}
    return write_record("kvlab diverge", args.json, document(session, prompt, loaded.info()) if args.json else {})
