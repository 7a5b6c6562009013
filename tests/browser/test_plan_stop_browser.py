"""The Plan tab's Stop button and a closed page both end a plan between two steps, in headless chromium.

The app runs in this process (on an empty pool: a plan reads no weights) so the test can count the strategies
the planner measures; each strategy is slowed to 1.5 s so that the plan is still running when the page acts.
Right: once the status line says one strategy is done, Stop (or closing the page) lets the strategy in
progress finish and measures no other. No wall-clock time is asserted.
"""

import socket
import time

import pytest

from app import create_app
from kvlab.models.loading import ModelPool
from kvlab.plan import planner

from pagekit import open_page

STRATEGY_DELAY_S = 1.5
SETTLE_S = 3 * STRATEGY_DELAY_S
"""How long the test watches for more strategies after Stop or the close."""
STATUS = "#plan-status"


@pytest.fixture(scope="module")
def slow_app():
    port_socket = socket.socket()
    port_socket.bind(("127.0.0.1", 0))
    port = port_socket.getsockname()[1]
    port_socket.close()
    demo = create_app(ModelPool(), preload=False)
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        yield demo.local_url
    finally:
        demo.close()


@pytest.fixture
def measured(monkeypatch):
    """The strategies the planner measures, in order; each takes STRATEGY_DELAY_S longer than it would."""
    names = []
    real = planner._plan_strategy

    def slow(arch, strategy, *args):
        names.append(strategy.name)
        time.sleep(STRATEGY_DELAY_S)
        return real(arch, strategy, *args)

    monkeypatch.setattr(planner, "_plan_strategy", slow)
    return names


@pytest.mark.parametrize("how", ["stop", "close"])
def test_a_plan_ends_between_two_steps_on_stop_or_when_the_page_closes(browser, slow_app, measured, how):
    page = open_page(browser, slow_app)
    page.get_by_role("tab", name="Plan").click()
    page.locator("#plan-run").click()
    page.wait_for_function(f"() => /1 of 6 strategies done/.test(document.querySelector('{STATUS}').innerText)",
                           timeout=120_000)
    if how == "stop":
        page.locator("#plan-stop").click()
        page.wait_for_function(f"() => /stopped/.test(document.querySelector('{STATUS}').innerText)")
    else:
        page.context.close()
    at_stop = len(measured)
    time.sleep(SETTLE_S)
    assert at_stop <= 2 and measured == ["dynamic", "static"][:at_stop], measured
    if how == "stop":
        page.context.close()
