"""Start-up probe run by the bench: a fresh python loads the bundled model and makes one token.

Prints one JSON line of `time.time()` values (seconds since the epoch) at which
each stage ended: `imports` (interpreter + `import torch, transformers`),
`lazy_imports` (kvlab and transformers' lazily imported modelling and cache
modules), `ready` (`load_model` returned) and `first_token`. The parent
subtracts its own spawn time.

The bench runs this file by path, `python -P kvlab/bench/startup_child.py PROMPT`
(`-P`: the file's folder is not put on `sys.path`), so that nothing is imported
before the first mark: `python -m kvlab.bench.startup_child PROMPT` also works,
but imports the `kvlab` package (torch, transformers and transformers' cache
module) before this code runs, which moves that time out of the breakdown.
This module measures; it judges and formats nothing.
"""

import json
import sys
import time


def main(argv: list[str]) -> int:
    """Run the stages for the prompt in `argv[0]` and print their marks; returns the exit status."""
    marks = {}
    import torch  # noqa: F401 - imported to be timed
    import transformers  # noqa: F401 - imported to be timed

    marks["imports"] = time.time()
    import transformers.cache_utils  # noqa: F401 - imported to be timed
    import transformers.modeling_utils  # noqa: F401 - imported to be timed

    import kvlab  # noqa: F401 - imported to be timed

    marks["lazy_imports"] = time.time()
    from kvlab.compare.events import TokenEvent
    from kvlab.compare.runner import run_compare
    from kvlab.generation import GenerationSettings, encode_prompt
    from kvlab.models.loading import ModelSpec, load_model

    loaded = load_model(ModelSpec(device="cpu"))
    marks["ready"] = time.time()
    ids = encode_prompt(loaded.tokenizer, argv[0])
    settings = GenerationSettings(max_new_tokens=1, stop_at_eos=False, fidelity=False)
    for event in run_compare(loaded, ids, [{"strategy": "dynamic"}], settings):
        if isinstance(event, TokenEvent) and "first_token" not in marks:
            marks["first_token"] = time.time()
    print(json.dumps(marks))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
