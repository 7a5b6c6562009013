"""The opening columns' one-time warm-up is the last step of the model's load (`kvlab.ui.compare.warm`): the
load reports it as progress, the model counts as ready only after it, and the first Run on the page then
shows no warm-up phase and bills no column for one. Behaviour only, on a fresh copy of the tiny model (its
own warm-up record), never a time."""

import copy
import threading

import pytest

gr = pytest.importorskip("gradio")

from kvlab.compare.events import RunPhase  # noqa: E402
from kvlab.compare.runner import run_compare  # noqa: E402
from kvlab.generation import GenerationSettings, encode_prompt  # noqa: E402
from kvlab.models.loading import LoadedModel, ModelSpec  # noqa: E402
from kvlab.compare.preset import load_preset  # noqa: E402
from kvlab.ui.compare.tab import CompareTab  # noqa: E402
from kvlab.ui.compare.warm import OpeningWarmUp  # noqa: E402
from kvlab.ui.shared.loader import BackgroundLoader  # noqa: E402

pytestmark = pytest.mark.unit

OPENING = """name: quickstart
model: {source: bundled}
prompt: {text: "Tell me a short story about a cache that forgot.", chat: false}
generation: {max_new_tokens: 5, stop_at_eos: false, fidelity: false}
columns:
  - strategy: dynamic
  - strategy: static
  - strategy: sink
    window_length: 8
    num_sink_tokens: 2
"""


class FreshPool:
    """A pool whose every spec is one fresh copy of the tiny model, loaded on the first `get`."""

    def __init__(self, tiny):
        self.model = LoadedModel(tiny.spec, copy.deepcopy(tiny.model), tiny.tokenizer, tiny.device, 0.0, "fresh")
        self.got = threading.Event()
        self.watch, self.seen = None, []

    def get(self, spec, progress=None):
        if progress is not None:
            progress(1.0, "fresh ready")  # what `kvlab.models.loading` says as its weights are in
            if self.watch is not None:
                self.seen.append(self.watch())
        self.got.set()
        return self.model

    def loaded(self, spec):
        return self.model if self.got.is_set() else None


@pytest.fixture
def opening(tmp_path):
    path = tmp_path / "quickstart.yaml"
    path.write_text(OPENING)
    return {"quickstart": path}


def statuses_of_first_run(tab: CompareTab) -> tuple[list[str], dict]:
    """Every run-status line the page's first Run shows (the form as the page opens), and the run's view."""
    data = {component: component.value for component in tab.run_inputs}
    data[tab.session] = {}
    session = {}
    lines = [str(update[tab.run_status]) for update in tab.stream(tab.request_from(data), threading.Event(), session)
             if tab.run_status in update]
    return lines, session["view"]


def test_the_load_warms_the_opening_columns_and_the_first_run_shows_no_warm_up(tiny, opening):
    pool = FreshPool(tiny)
    seen = []
    with gr.Blocks():
        tab = CompareTab(pool, preload=False, presets=opening)
        (real,) = tab.loader.warm

        def watched(loaded, progress):
            def report(fraction, message):
                progress(fraction, message)
                seen.append(tab.loader.status(ModelSpec()))  # the weights are in the pool, the load goes on
            return real(loaded, report)

        tab.loader.warm = (watched,)
        tab.build()
    pool.watch = lambda: tab.loader.status(ModelSpec())
    tab.loader.start(ModelSpec())
    tab.loader.get(ModelSpec())
    (weights_in,) = pool.seen  # the load's own "ready" is not shown as the end of the load
    assert weights_in.state == "loading" and "ready" not in weights_in.message and weights_in.fraction < 1
    assert [status.state for status in seen] == ["loading"] * 3
    assert "warming up the opening columns once (1 of 3: dynamic)" in seen[0].message
    assert tab.loader.status(ModelSpec()).state == "ready"
    lines, view = statuses_of_first_run(tab)
    assert lines and not any("warming up" in line for line in lines)
    assert "finished" in lines[-1]
    assert [column.result.timing.warm_up_s for column in view.columns] == [0.0, 0.0, 0.0]


def test_without_the_load_step_the_first_run_pays_the_warm_up(tiny, opening):
    pool = FreshPool(tiny)
    with gr.Blocks():
        tab = CompareTab(pool, preload=False, presets=opening, loader=BackgroundLoader(pool)).build()
    tab.loader.get(ModelSpec())
    lines, view = statuses_of_first_run(tab)
    assert any("warming up" in line for line in lines)
    assert all(column.result.timing.warm_up_s > 0 for column in view.columns)


def test_the_warm_up_covers_the_runs_prompt_shapes_and_every_event_of_a_first_run(tiny, opening):
    pool = FreshPool(tiny)
    loader = BackgroundLoader(pool, warm=(OpeningWarmUp(opening),))
    loaded = loader.get(ModelSpec())
    preset = load_preset(opening["quickstart"])
    ids = encode_prompt(loaded.tokenizer, preset.prompt.text, preset.prompt.system, preset.prompt.chat)
    settings = GenerationSettings(max_new_tokens=5, stop_at_eos=False, fidelity=False)
    events = list(run_compare(loaded, ids, preset.build_columns(), settings, "fair", threading.Event()))
    assert not [event for event in events if isinstance(event, RunPhase) and event.phase == "warm_up"]
    assert all(result.timing.warm_up_s == 0.0 for result in events[-1].results)


def test_a_warm_up_that_fails_leaves_the_model_ready(tiny, opening, tmp_path):
    broken = tmp_path / "quickstart.yaml"
    broken.write_text("name: quickstart\ncolumns: not a list\n")
    pool = FreshPool(tiny)
    loader = BackgroundLoader(pool, warm=(OpeningWarmUp({"quickstart": broken}),))
    assert loader.get(ModelSpec()) is pool.model
    assert loader.status(ModelSpec()).state == "ready"
