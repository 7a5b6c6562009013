"""ChatSessions: at most N chat caches at once, idle ones released after a while, a closed tab freed at once."""

import pytest

from kvlab.chat.session import ChatInputError
from kvlab.ui.chat.sessions import ChatServerFull, ChatSessions, ChatTabState


class FakeSession:
    """Holds a 'cache' and a conversation like `kvlab.chat.session.ChatSession`, no model."""

    def __init__(self):
        self.cache, self.history, self.reason = object(), [{"role": "user", "content": "hi"}], ""

    def drop_cache(self, reason):
        self.cache, self.reason = None, reason

    def clear(self):
        self.cache, self.history = None, []


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def holder() -> ChatTabState:
    return ChatTabState(session=FakeSession())


def test_the_least_recently_used_idle_cache_makes_room_and_says_why():
    clock = Clock()
    sessions = ChatSessions(max_caches=2, idle_s=1000, clock=clock)
    a, b, c = holder(), holder(), holder()
    for key, state in (("a", a), ("b", b)):
        clock.now += 1
        sessions.admit(key, state)
    clock.now += 1
    sessions.admit("c", c)
    assert a.session.cache is None and "at most 2 are kept, KVLAB_MAX_CHAT_SESSIONS" in a.session.reason
    assert a.session.history, "the conversation stays; only its cache is released"
    assert b.session.cache is not None and sessions.live_caches() == 2


def test_when_every_cache_is_generating_a_new_turn_is_refused_clearly():
    sessions = ChatSessions(max_caches=1, idle_s=1000, clock=Clock())
    busy = holder()
    sessions.admit("busy", busy)
    busy.idle.clear()
    with pytest.raises(ChatServerFull, match=r"at most 1 chat caches \(KVLAB_MAX_CHAT_SESSIONS\)"):
        sessions.admit("new", holder())
    assert busy.session.cache is not None


def test_an_idle_cache_is_released_after_its_time():
    clock = Clock()
    sessions = ChatSessions(max_caches=8, idle_s=60, clock=clock)
    old = holder()
    sessions.admit("old", old)
    clock.now = 61
    sessions.admit("new", holder())
    assert old.session.cache is None and "released after 60 s without a turn" in old.session.reason


def test_release_and_release_state_free_everything():
    sessions = ChatSessions(max_caches=8, idle_s=60, clock=Clock())
    state = holder()
    sessions.admit("tab", state)
    assert sessions.release("tab") and not sessions.release("tab")
    assert state.session.cache is None and state.session.history == [] and state.stop.is_set()
    other = holder()
    sessions.admit("other", other)
    sessions.release_state(other)
    assert other.session.cache is None and sessions.live_caches() == 0


def test_stop_reply_waits_for_the_running_turn_or_says_it_did_not_stop():
    state = holder()
    assert state.stop_reply() is False
    state.idle.clear()
    with pytest.raises(ChatInputError, match="did not stop within 0 s"):
        state.stop_reply(wait_s=0.01)
    assert state.stop.is_set()


def test_the_cap_must_be_positive():
    with pytest.raises(ValueError, match="KVLAB_MAX_CHAT_SESSIONS must be at least 1"):
        ChatSessions(max_caches=0)
