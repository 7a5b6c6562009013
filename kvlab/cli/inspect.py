"""`python -m kvlab inspect`: step one strategy's generation loop and record what its cache holds after every step.

`inspect --strategy sink:window_length=32 --prompt "..." --steps 40 --json OUT` runs the engine's own loop
(`kvlab.inspect.inspector.InspectSession`) for `--steps` tokens, prints one line per step (token, fed ids, positions,
cache bytes, tokens held) and writes one record per step (`StepRecord.to_json`: the forwards' `input_ids`
shape, `cache_position`, `position_ids`, attention-mask shape, the token, the top-5 and, for a lossy strategy,
the dynamic cache's top-5 and the KL between them, and the per-layer table with its token strips). Bad input
prints the reason on stderr and exits with status 2.
"""

from __future__ import annotations

import sys

from ..inspect.inspector import MAX_INSPECT_STEPS
from .common import WEIGHTS_DEFAULTS, model_defaults
from .stepped import open_session, print_steps, write_record

DEFAULT_STEPS = 32


def add_parser(sub, parents) -> None:
    """Add the `inspect` subcommand; `parents` holds the shared `--model/--dtype/--device` parent."""
    p = sub.add_parser("inspect", parents=parents, help="step one strategy's generation loop and record its cache after each step")
    p.add_argument("--strategy", default="dynamic",
                   help="one strategy, knobs after colons: sink:window_length=32 | quantized:backend=hqq:nbits=4 "
                        "(default dynamic)")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--system", default="", help="system prompt for chat models")
    p.add_argument("--plain", action="store_true", help="tokenize the prompt as plain text, without the chat template")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"tokens to generate, one step each (1..{MAX_INSPECT_STEPS}, default {DEFAULT_STEPS})")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--json", help="write the per-step records to this file")
    model_defaults(p, WEIGHTS_DEFAULTS)
    p.set_defaults(func=cmd_inspect)


def _session(args):
    """(loaded model, InspectSession). Raises ValueError (StrategyError, InspectError) or ModelLoadError."""
    from ..generation import GenerationSettings, check_prompt, encode_prompt
    from ..inspect.inspector import InspectSession
    from ..models.loading import ModelSpec, load_model
    from ..strategies import make_strategy
    from ..strategies.base import parse_strategy_item
    from .outputs import check_writable

    check_prompt(args.prompt)
    check_writable(args.json)
    strategy = make_strategy(parse_strategy_item(args.strategy.strip()))
    settings = GenerationSettings(max_new_tokens=args.steps, do_sample=args.sample, temperature=args.temperature,
                                  top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                                  stop_at_eos=not args.ignore_eos, fidelity=False)
    if not 1 <= args.steps <= MAX_INSPECT_STEPS:
        raise ValueError(f"--steps must be from 1 to {MAX_INSPECT_STEPS}, got {args.steps}")
    settings.check()
    loaded = load_model(ModelSpec(args.model, args.dtype, args.device),
                        progress=lambda f, m: print(f"[model] {m}", file=sys.stderr))
    prompt_ids = encode_prompt(loaded.tokenizer, args.prompt, args.system, not args.plain)
    return loaded, InspectSession(loaded, strategy, prompt_ids, settings)


def step_line(record) -> str:
    """One printed line per step: index, token, fed ids, positions, mask, bytes, tokens held, KL."""
    last = record.last
    held = record.layers[0].held_tokens if record.layers else 0
    kl = f" KL {record.kl_nats:.4f}" if record.kl_nats is not None else ""
    return (f"{record.index:>4} {record.token_text!r:<14} fed {record.fed_tokens:>4} "
            f"positions {last.position_ids[0]}..{last.position_ids[1]} mask {record.mask_shape} "
            f"held {held} cache {record.cache_bytes:,} B{kl}")


def cmd_inspect(args) -> int:
    """Run the `inspect` subcommand; returns the exit status."""
    opened = open_session("kvlab inspect", lambda: _session(args))
    if isinstance(opened, int):
        return opened
    loaded, session = opened
    records = [record.to_json() for record in print_steps("kvlab inspect", session, args.steps, step_line)]
    print(f"{len(records)} steps ({session.stop_reason}); {session.strategy.describe()}")
    document = {"model": loaded.info(), "strategy": session.strategy.describe(),
                "spec": {"strategy": session.strategy.name, **session.strategy.knobs()},
                "prompt": {"text": args.prompt, "system": args.system, "chat": not args.plain},
                "prompt_tokens": session.prompt_ids.shape[1], "stop_reason": session.stop_reason,
                "token_ids": session.token_ids, "steps": records}
    return write_record("kvlab inspect", args.json, document)
