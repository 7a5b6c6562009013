"""ZeroGPU: with a stand-in `spaces` package importable, building the app wraps every GPU-bound entry point
(Compare's Run and its `compare` API, the chat turn, regenerate and prefix reuse, the perplexity run, the
Inspect steps) with `spaces.GPU(duration=...)`, each duration sized from columns × tokens; without `spaces`
the handlers are the tabs' own methods, unwrapped. The model-bound ones are seen through kvlab's turn wrapper
(`kvlab.ui.hosting.turns`), which stands outside the GPU one: a run waits for its turn before it asks for a GPU.
Also the queue's max_size setting and the Duplicate button."""

import functools
import inspect
import sys
import types

import pytest

gr = pytest.importorskip("gradio")

import app  # noqa: E402
from kvlab.ui.hosting import zerogpu  # noqa: E402

pytestmark = pytest.mark.unit
GPU_BOUND = {"run", "compare", "_on_send", "_on_regenerate", "_on_prefix", "_on_run", "on_step", "on_step10",
             "on_reset"}


def fake_spaces() -> types.ModuleType:
    """A module with `GPU(duration=...)` that records (function name, duration) and wraps like the real one
    (generators stay generators, signatures are kept)."""
    module = types.ModuleType("spaces")
    module.calls = []

    def GPU(duration):  # noqa: N802 - the real decorator's name
        def decorate(fn):
            module.calls.append((fn.__name__, duration))
            if inspect.isgeneratorfunction(fn):
                @functools.wraps(fn)
                def wrapper(*args, **kwargs):
                    yield from fn(*args, **kwargs)
            else:
                @functools.wraps(fn)
                def wrapper(*args, **kwargs):
                    return fn(*args, **kwargs)
            wrapper.on_zerogpu = True
            return wrapper
        return decorate

    module.GPU = GPU
    return module


TURNED = GPU_BOUND - {"_on_send", "_on_regenerate", "_on_prefix"}
"""The entry points that take a turn in kvlab's scheduler (chat turns do not)."""


def handlers(demo) -> list:
    """The event functions, seen through kvlab's turn wrapper."""
    return [getattr(block_fn.fn, "kvlab_turn", block_fn.fn) for block_fn in demo.fns.values() if block_fn.fn is not None]


def test_with_spaces_the_gpu_bound_entry_points_are_wrapped_with_a_sized_duration(monkeypatch):
    spaces = fake_spaces()
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    demo = app.create_app(preload=False)
    wrapped = {name for name, _ in spaces.calls}
    assert GPU_BOUND <= wrapped, f"not wrapped: {GPU_BOUND - wrapped}"
    assert sum(getattr(fn, "on_zerogpu", False) for fn in handlers(demo)) >= len(GPU_BOUND)
    assert all(inspect.isgeneratorfunction(fn) == inspect.isgeneratorfunction(fn.__wrapped__)
               for fn in handlers(demo) if getattr(fn, "on_zerogpu", False))
    turned = {block_fn.fn.kvlab_turn.__name__ for block_fn in demo.fns.values() if hasattr(block_fn.fn, "kvlab_turn")}
    assert TURNED <= turned, f"not taking a turn: {TURNED - turned}"
    durations = dict(spaces.calls)
    run_s = durations["run"]
    tab = run_s.__self__
    data = {component: component.value for component in tab.run_inputs}
    short = run_s(data)
    data[tab.max_new_tokens] = 1000
    assert zerogpu.MIN_DURATION_S <= short < run_s(data) <= zerogpu.MAX_DURATION_S
    assert zerogpu.MIN_DURATION_S <= durations["compare"]("quickstart", None, 64) <= zerogpu.MAX_DURATION_S
    chat = durations["_on_send"].__self__
    chat_data = {component: component.value for component in chat.form_inputs}
    assert durations["_on_send"](chat_data, None) >= zerogpu.MIN_DURATION_S
    assert zerogpu.hidden_knobs() == {"static": frozenset({"compile"})}


def test_without_spaces_nothing_is_wrapped(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` raises ImportError
    assert not zerogpu.available() and zerogpu.hidden_knobs() == {}
    demo = app.create_app(preload=False)
    fns = handlers(demo)
    assert not any(getattr(fn, "on_zerogpu", False) or hasattr(fn, "__wrapped__") for fn in fns)
    names = {getattr(fn, "__name__", "") for fn in fns}
    assert GPU_BOUND <= names
    run = next(fn for fn in fns if getattr(fn, "__name__", "") == "run")
    assert inspect.ismethod(run) and run.__func__ is type(run.__self__).run


def test_queue_max_size_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("KVLAB_QUEUE_MAX_SIZE", raising=False)
    assert app.queue_max_size() == app.DEFAULT_QUEUE_MAX_SIZE == 16
    monkeypatch.setenv("KVLAB_QUEUE_MAX_SIZE", "4")
    assert app.queue_max_size() == 4
    monkeypatch.setenv("KVLAB_QUEUE_MAX_SIZE", "0")
    assert app.queue_max_size() is None
    for bad in ("-1", "lots", "2.5"):
        monkeypatch.setenv("KVLAB_QUEUE_MAX_SIZE", bad)
        with pytest.raises(ValueError, match=f"KVLAB_QUEUE_MAX_SIZE must be a whole number >= 0.*{bad!r}"):
            app.queue_max_size()


def test_the_duplicate_button_shows_only_on_a_space(monkeypatch):
    monkeypatch.delenv("SYSTEM", raising=False)
    assert not app.on_space()
    monkeypatch.setenv("SYSTEM", "spaces")
    monkeypatch.setenv("SPACE_ID", "someone/kvlab")
    assert app.on_space()
