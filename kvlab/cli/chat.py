"""Command line: `python -m kvlab chat` (scripted multi-turn chat) and `python -m kvlab prefix` (prefix reuse).

`chat --turns FILE --strategy NAME[:knob=value...]` runs a YAML list of user
messages as one conversation with one cache kept across turns, printing one row
per turn (reused and prefilled tokens, TTFT with and without reuse); a
`budget_mib=N` knob (and `--fallback`) gives the conversation's cache a budget
(`kvlab.budget`), whose switches each turn lists; the no-reuse re-run can be
sampled (`--no-reuse-every N`, 0 = never) because it prefills the whole history; `--verify` also generates each reply without reuse
and reports `match`. The JSON record is rewritten after every turn, so an
interrupt (Ctrl-C) keeps the finished turns.

`prefix --prefix FILE --prompts FILE` prefills the prefix file once and answers
every prompt of a YAML list from a copy of its cache, and again without reuse.

Both write their full record with `--json OUT`. A bad file, an unknown strategy
or invalid settings print the reason on stderr and exit with status 2.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from ..strategies.base import names_with, parse_strategy_list
from ..generation import GenerationSettings
from .common import WEIGHTS_DEFAULTS, model_defaults

EXIT_USAGE = 2


class CliInputError(ValueError):
    """A file or flag the command cannot use; the message says which and why."""


def add_parser(sub, parents) -> None:
    """Add the `chat` and `prefix` subcommands; `parents` holds the shared `--model/--dtype/--device` parent."""
    chat = sub.add_parser("chat", parents=parents, help="run a scripted multi-turn chat with one cache kept across turns")
    chat.add_argument("--turns", required=True, help="YAML file: a list of user messages")
    chat.add_argument("--strategy", default="dynamic",
                      help="one strategy, knobs after colons: dynamic | static:max_cache_len=512 | "
                           "quantized:backend=quanto:nbits=4 | sink (default dynamic)")
    chat.add_argument("--fallback", help="fallback chain when --strategy has budget_mib=N, items joined by '>' "
                                         "(default: quantized hqq int4 > sink)")
    chat.add_argument("--system", default="", help="system prompt")
    chat.add_argument("--verify", action="store_true", help="also generate every reply without reuse and compare")
    chat.add_argument("--no-reuse-every", type=int, default=1, metavar="N",
                      help="re-run every Nth turn without reuse to time it (1 = every turn, the default; 0 = never): "
                           "the re-run prefills the whole history, which grows with the conversation")
    _add_common(chat)
    chat.set_defaults(func=cmd_chat)

    prefix = sub.add_parser("prefix", parents=parents, help="prefill a shared prefix once and answer several prompts from copies of it")
    prefix.add_argument("--prefix", required=True, help="text file: the shared system prompt or document")
    prefix.add_argument("--prompts", required=True, help="YAML file: a list of prompts")
    prefix.add_argument("--strategy", default="dynamic",
                        help="dynamic | static[:max_cache_len=N] | quantized[:backend=quanto:nbits=4...] "
                             "(default dynamic)")
    prefix.add_argument("--plain", action="store_true",
                        help="plain text instead of the chat template (prefix and prompt concatenated)")
    _add_common(prefix)
    prefix.set_defaults(func=cmd_prefix)


def _add_common(parser) -> None:
    model_defaults(parser, WEIGHTS_DEFAULTS)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the full record to this file")


def read_message_list(path: str, what: str) -> list[str]:
    """A YAML file holding a non-empty list of non-empty strings.

    Raises:
        CliInputError: missing or unreadable file, not YAML, not such a list; the message names the file.
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise CliInputError(f"cannot read {what} file {path!r}: {err.strerror or err}") from err
    except yaml.YAMLError as err:
        raise CliInputError(f"{what} file {path!r} is not valid YAML: {err}") from err
    if not isinstance(data, list) or not data:
        raise CliInputError(f"{what} file {path!r} must be a non-empty YAML list of messages, "
                            "e.g.\n- Hello!\n- And then?")
    for i, item in enumerate(data, 1):
        if not isinstance(item, str) or not item.strip():
            raise CliInputError(f"{what} file {path!r}: item {i} must be a non-empty string, got {item!r}")
    return data


def read_text(path: str, what: str) -> str:
    """A non-empty UTF-8 text file. Raises CliInputError naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise CliInputError(f"cannot read {what} file {path!r}: {err.strerror or err}") from err
    if not text.strip():
        raise CliInputError(f"{what} file {path!r} is empty")
    return text


def _one_spec(text: str) -> dict:
    """The one `name[:knob=value...]` spec of a `--strategy` value. Raises CliInputError."""
    try:
        specs = parse_strategy_list(text)
    except ValueError as err:
        raise CliInputError(str(err)) from err
    if len(specs) != 1:
        raise CliInputError(f"--strategy takes exactly one strategy, got {len(specs)} in {text!r}")
    return specs[0]


def _cache_keeping(spec: dict):
    from ..strategies import make_strategy

    strategy = make_strategy(spec)
    if not strategy.usable_in_chat:
        raise CliInputError(f"{strategy.name} keeps no cache, so there is nothing to reuse; pick one of "
                            f"{', '.join(names_with('usable_in_chat'))}")
    return strategy


def parse_strategy(text: str):
    """One strategy from `name[:knob=value...]` (the syntax of compare's `--strategies`).

    Raises:
        CliInputError: not exactly one strategy, a malformed knob, a strategy without a cache.
        StrategyError: unknown name or knob.
    """
    return _cache_keeping(_one_spec(text))


def parse_chat_strategy(text: str, fallback: str | None = None):
    """(strategy, `kvlab.budget.Budget` or None) from `--strategy`, which may carry `budget_mib=N` (and
    `fallback=a>b`), and `--fallback`.

    Raises:
        CliInputError, StrategyError: as `parse_strategy`, or a bad budget or chain.
    """
    from ..budget import parse_budget

    spec = _one_spec(text)
    budget_mib, chain = spec.pop("budget_mib", None), spec.pop("fallback", fallback)
    if budget_mib is None and fallback is not None:
        raise CliInputError("--fallback needs a budget: add budget_mib=N to --strategy")
    return _cache_keeping(spec), parse_budget(budget_mib, chain)


def settings_from(args) -> GenerationSettings:
    """Generation settings from the common flags. Raises ValueError listing every problem."""
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                                  temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                  seed=args.seed, fidelity=False)
    settings.check()
    return settings


def _load(args):
    """The model of the flags, once the --json path is known to be writable (`kvlab.cli.outputs`). Raises
    OutputError or ModelLoadError."""
    from ..models.loading import ModelSpec, load_model
    from .outputs import check_writable

    check_writable(args.json)
    return load_model(ModelSpec(args.model, args.dtype, args.device),
                      progress=lambda fraction, message: print(f"[model] {message}", file=sys.stderr))


def _fail(command: str, err: Exception) -> int:
    print(f"kvlab {command}: {err}", file=sys.stderr)
    return EXIT_USAGE


def _write_json(path: str | None, record: dict, silent: bool = False) -> None:
    """Write `record` to `path` (nothing when None) through a temporary file, so a reader or an interrupt
    never sees half a file."""
    if path:
        target = Path(path)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(record, indent=1))
        os.replace(partial, target)
        if not silent:
            print(f"wrote {path}", file=sys.stderr)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def measured_turn(turn: int, every: int) -> bool:
    """Whether turn `turn` (1-based) is re-run without reuse when sampling every `every` turns (0 = never)."""
    return every > 0 and (turn - 1) % every == 0


def cmd_chat(args) -> int:
    """Run the scripted conversation; 0 on success, 2 when it cannot start, 1 when a turn fails, 130 when
    interrupted. The JSON record is rewritten after every turn, so an interrupt keeps every finished turn."""
    from ..chat.session import ChatSession
    from ..models.loading import ModelLoadError

    try:
        turns = read_message_list(args.turns, "turns")
        strategy, budget = parse_chat_strategy(args.strategy, args.fallback)
        settings = settings_from(args)
        if args.no_reuse_every < 0:
            raise CliInputError(f"--no-reuse-every must be 0 (never) or a number of turns, got {args.no_reuse_every}")
        loaded = _load(args)
        session = ChatSession(loaded, strategy, settings, args.system, budget)
    except (ValueError, ModelLoadError) as err:
        return _fail("chat", err)
    record = {"command": "chat", "model": loaded.info(), "strategy": strategy.describe(), "knobs": strategy.knobs(),
              "budget": budget.spec() if budget is not None else None,
              "system": args.system, "verify": args.verify, "no_reuse_every": args.no_reuse_every,
              "settings": vars(settings), "turns": [], "error": None, "finished": False}
    print(f"{'turn':>4} {'action':>8} {'reused':>6} {'prefilled':>9} {'ttft_s':>7} {'no_reuse_s':>10} "
          f"{'match':>5}  reply")
    status = 0
    try:
        status = _chat_turns(session, turns, args, record)
    except KeyboardInterrupt:
        record["error"] = f"interrupted after {len(record['turns'])} of {len(turns)} turns"
        print(f"kvlab chat: {record['error']}", file=sys.stderr)
        status = 130
    finally:
        record["finished"] = status == 0
        _write_json(args.json, record, silent=False)
    return status


def _chat_turns(session, turns: list[str], args, record: dict) -> int:
    """Send every turn, printing a row and rewriting the JSON after each; the exit status."""
    from ..chat.session import ChatInputError, ChatTurnDone, ChatTurnFailed

    for number, text in enumerate(turns, 1):
        measure = args.verify or measured_turn(number, args.no_reuse_every)
        try:
            events = list(session.send(text, baseline=measure, verify=args.verify))
        except ChatInputError as err:
            record["error"] = str(err)
            return _fail("chat", err)
        failed = [e for e in events if isinstance(e, ChatTurnFailed)]
        if failed:
            record["error"] = f"turn {number} failed: {failed[0].message}"
            print(f"kvlab chat: {record['error']}", file=sys.stderr)
            return 1
        stats = next(e.stats for e in events if isinstance(e, ChatTurnDone))
        match = "-" if stats.match is None else str(stats.match).lower()
        record["turns"].append(stats.to_json())
        _write_json(args.json, record, silent=True)  # saved before it is shown: a turn on screen is on disk
        print(f"{stats.turn:>4} {stats.action:>8} {stats.reused_tokens:>6} {stats.prefilled_tokens:>9} "
              f"{_seconds(stats.ttft_s):>7} {_seconds(stats.no_reuse_ttft_s):>10} {match:>5}  "
              f"{stats.reply[:60]!r}", flush=True)
    return 0


def cmd_prefix(args) -> int:
    """Answer every prompt after the shared prefix; 0 on success, 2 when it cannot start."""
    from ..models.loading import ModelLoadError
    from ..chat.prefix import run_prefix_reuse

    try:
        prefix = read_text(args.prefix, "prefix")
        prompts = read_message_list(args.prompts, "prompts")
        strategy = parse_strategy(args.strategy)
        settings = settings_from(args)
        loaded = _load(args)
        report = run_prefix_reuse(loaded, strategy, prefix, prompts, settings, chat=not args.plain)
    except (ValueError, ModelLoadError) as err:
        return _fail("prefix", err)
    print(f"prefix: {report.prefix_tokens} tokens prefilled once in {report.prefix_prefill_s:.3f} s "
          f"({report.strategy})")
    print(f"{'#':>2} {'reused':>6} {'prefilled':>9} {'with_s':>7} {'without_s':>9} {'saved_s':>7} {'match':>5}  reply")
    for i, result in enumerate(report.results, 1):
        print(f"{i:>2} {result.reused_tokens:>6} {result.prefilled_tokens:>9} {result.with_reuse_s:>7.3f} "
              f"{result.without_reuse_s:>9.3f} {result.saved_s:>7.3f} {str(result.match).lower():>5}  "
              f"{result.reply[:60]!r}")
    print(f"total: {report.total_with_s:.3f} s with reuse (prefix prefill included) vs "
          f"{report.total_without_s:.3f} s without; saved {report.total_saved_s:.3f} s")
    _write_json(args.json, {"command": "prefix", "model": loaded.info(), "knobs": strategy.knobs(),
                            "settings": vars(settings), **report.to_json()})
    return 0
