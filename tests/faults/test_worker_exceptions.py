"""Fault catalogue: an exception inside the model work of every tab (Compare, Chat, prefix reuse, Perplexity, Inspect).
Right: the tab shows the message where the user looks, the next action works, and no kvlab thread is left
running. The exception is injected into a strategy's forward pass on a tiny random model, in-process."""

import threading
import time
from html import unescape

import pytest

gr = pytest.importorskip("gradio")

from kvlab.strategies.dynamic import Dynamic  # noqa: E402
from kvlab.ui.chat.tab import ChatTab  # noqa: E402
from kvlab.ui.chat.view import ChatForm  # noqa: E402
from kvlab.ui.compare.tab import CompareTab  # noqa: E402
from kvlab.ui.compare.form import RunRequest  # noqa: E402
from kvlab.ui.perplexity.tab import PerplexityTab  # noqa: E402
from kvlab.ui.perplexity.view import PerplexityRequest  # noqa: E402

pytestmark = pytest.mark.unit
BOOM = "injected failure in the forward pass"



@pytest.fixture
def failing_forward(monkeypatch):
    """Make dynamic's forward raise from its third call on; `restore()` puts the real one back."""
    real, calls = Dynamic.forward, []

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) >= 3:
            raise RuntimeError(BOOM)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Dynamic, "forward", forward)
    return lambda: monkeypatch.setattr(Dynamic, "forward", real)


def kvlab_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("kvlab-") and "compute" not in t.name}


def no_kvlab_thread_left(before: set[str]) -> bool:
    deadline = time.monotonic() + 10
    while kvlab_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return not (kvlab_threads() - before)


def merged(stream) -> dict:
    final = {}
    for updates in stream:
        final.update(updates)
    return final


def test_compare(tiny_pool, failing_forward):
    before = kvlab_threads()
    with gr.Blocks():
        tab = CompareTab(tiny_pool, preload=False).build()
    request = RunRequest(prompt="Hello", max_new_tokens=6, ignore_eos=True, fidelity=False,
                         slots=[("dynamic", []), ("static", [])])
    final = merged(tab.stream(request, threading.Event()))
    status = " ".join(str(update) for update in final.values())
    assert BOOM in status and "error" in status
    assert no_kvlab_thread_left(before)
    failing_forward()
    again = merged(tab.stream(request, threading.Event()))
    assert "2 done" in str(again[tab.run_status])


def test_chat(tiny_pool, failing_forward):
    before = kvlab_threads()
    with gr.Blocks():
        tab = ChatTab(tiny_pool).build()
    form = ChatForm(max_new_tokens=6, measure=False)
    failed = merged(tab.send("Hello", None, form))
    assert f"the turn failed: RuntimeError: {BOOM}" in unescape(failed[tab.notice])
    assert failed[tab.message] == "Hello", "the message that failed goes back into the box"
    assert no_kvlab_thread_left(before)
    failing_forward()
    state = failed[tab.state]
    again = merged(tab.send("Hello", state, form))
    assert again[tab.notice] == "" and "Turn 1" in again[tab.turn_info]


def test_prefix_reuse(tiny_pool, failing_forward):
    before = kvlab_threads()
    with gr.Blocks():
        tab = ChatTab(tiny_pool).build()
    form = ChatForm(max_new_tokens=4, measure=False)
    failed = tab.run_prefix(form, "A shared document about gardens.", "What grows?\nWhen?")
    assert f"prefix reuse failed: RuntimeError: {BOOM}" in failed[tab.prefix_info]
    assert no_kvlab_thread_left(before)
    failing_forward()
    again = tab.run_prefix(form, "A shared document about gardens.", "What grows?\nWhen?")
    assert "prefilled once" in again[tab.prefix_info]


def test_perplexity(tiny_pool, failing_forward):
    before = kvlab_threads()
    with gr.Blocks():
        tab = PerplexityTab(tiny_pool).build()
    request = PerplexityRequest(choices=["dynamic"], tokens=64)
    failed = merged(tab.stream(request, threading.Event()))
    assert "the run failed after token" in unescape(failed[tab.status]) and BOOM in unescape(failed[tab.status])
    assert no_kvlab_thread_left(before)
    failing_forward()
    again = merged(tab.stream(request, threading.Event()))
    assert unescape(again[tab.status]).startswith("done: 63 tokens per cache")


def test_inspect(tiny_pool, failing_forward):
    from kvlab.ui.inspect.tab import InspectTab

    before = kvlab_threads()
    with gr.Blocks():
        tab = InspectTab(tiny_pool).build()
    form = {tab.prompt: "Tell me about the sea.", tab.system: "", tab.chat: True, tab.max_new_tokens: 12,
            tab.ignore_eos: True, tab.model_source: "bundled", tab.card.strategy: "dynamic", tab.state: None}
    form.update({box: "" for box in tab.card.knobs})
    failed = merged(tab.steps(form, 10))
    state = failed[tab.state]
    assert f"the step failed: RuntimeError: {BOOM}" in failed[tab.status]
    assert len(state.session.records) == 2, "the steps before the failure stay on the page"
    assert no_kvlab_thread_left(before)
    failing_forward()
    again = merged(tab.steps({**form, tab.state: state}, 10))
    assert len(state.session.records) == 12 and "failed" not in again[tab.status]
