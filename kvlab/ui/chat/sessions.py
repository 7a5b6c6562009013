"""Chat caches across browser sessions: how many live at once, how long an idle one is kept, and releasing a
closed session's cache at once.

Gradio keeps a closed session's `gr.State` for an hour before deleting it, and a
chat session's state holds its KV cache (a default static chat cache on the
bundled model is about 47 MB; a long dynamic one more). `ChatSessions` keeps
track of every session that holds a cache and:

- releases a session's cache and conversation when its tab closes (`release`,
  wired to the Blocks' `unload` event and the State's `delete_callback`);
- releases a cache left idle longer than `CHAT_CACHE_IDLE_S` (the conversation
  stays; its next turn re-prefills it and says why);
- holds at most `MAX_CHAT_SESSIONS` caches: a new one first releases the least
  recently used idle cache, and when every cache belongs to a reply still
  generating, the new turn is refused with a clear message.

`ChatTabState` is one browser session's chat (its `ChatSession`, stop flag and
whether a reply is running), so every control can stop a running reply first,
then act. Pure: no gradio, no model work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvlab.chat.session import ChatInputError, ChatSession

MAX_CHAT_SESSIONS = int(os.environ.get("KVLAB_MAX_CHAT_SESSIONS", "8"))
"""Chat caches kept at once across all browser sessions."""
CHAT_CACHE_IDLE_S = float(os.environ.get("KVLAB_CHAT_CACHE_IDLE_S", "900"))
"""Seconds an idle chat cache is kept before it is released (the conversation stays)."""
STOP_WAIT_S = 30.0
"""Longest a control waits for a running reply to stop before it acts."""


class ChatServerFull(ChatInputError):
    """Every chat cache the server keeps belongs to a reply that is still generating."""


@dataclass
class ChatTabState:
    """One browser session's chat: its `ChatSession` (created at the first message), its stop flag, whether a
    reply is running (`idle` is set when none is), and when it last did something (monotonic seconds)."""

    session: ChatSession | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    idle: threading.Event = field(default_factory=threading.Event)
    last_active: float = field(default_factory=time.monotonic)
    after_stop: object = None
    """A control that stopped the running reply and acts once it has ended (`ChatTab.clear`/`undo`): the
    streaming turn calls it before its last page update, so the page shows the control's result whichever of
    the two updates arrives last. Called once, then reset."""

    def __post_init__(self):
        self.idle.set()

    @property
    def running(self) -> bool:
        return not self.idle.is_set()

    @property
    def holds_cache(self) -> bool:
        return self.session is not None and self.session.cache is not None

    def stop_reply(self, wait_s: float = STOP_WAIT_S) -> bool:
        """Stop a running reply and wait for its turn to end; True when something was stopped.

        Raises:
            ChatInputError: the reply did not end within `wait_s` seconds.
        """
        if not self.running:
            return False
        self.stop.set()
        if not self.idle.wait(wait_s):
            raise ChatInputError(f"the running reply did not stop within {wait_s:.0f} s; try again in a moment")
        return True

    def release(self, reason: str) -> None:
        """Drop the cache (the conversation stays; the next turn re-prefills it and says `reason`)."""
        if self.session is not None and self.session.cache is not None:
            self.session.drop_cache(reason)


class ChatSessions:
    """The chat states that may hold a cache, keyed by browser session.

    Args:
        max_caches: most caches held at once (MAX_CHAT_SESSIONS).
        idle_s: seconds after which an idle cache is released (CHAT_CACHE_IDLE_S).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, max_caches: int = MAX_CHAT_SESSIONS, idle_s: float = CHAT_CACHE_IDLE_S,
                 clock: Callable[[], float] = time.monotonic):
        if max_caches < 1:
            raise ValueError(f"KVLAB_MAX_CHAT_SESSIONS must be at least 1, got {max_caches}")
        self.max_caches, self.idle_s, self.clock = max_caches, idle_s, clock
        self._states: dict[str, ChatTabState] = {}
        self._guard = threading.Lock()

    def admit(self, key: str, state: ChatTabState) -> None:
        """Register `state` under `key` before it runs a turn: release idle caches past their time, then make
        room under the cap by releasing the least recently used idle cache.

        Raises:
            ChatServerFull: the cap is reached and every other cache belongs to a running reply.
        """
        with self._guard:
            now = self.clock()
            state.last_active = now
            self._states[key] = state
            for other in self._states.values():
                if other is not state and not other.running and now - other.last_active > self.idle_s:
                    other.release(f"the cache was released after {self.idle_s:.0f} s without a turn")
            holders = [other for other in self._states.values() if other is not state and other.holds_cache]
            while len(holders) >= self.max_caches:
                idle = sorted((other for other in holders if not other.running), key=lambda other: other.last_active)
                if not idle:
                    raise ChatServerFull(
                        f"this server keeps at most {self.max_caches} chat caches (KVLAB_MAX_CHAT_SESSIONS) and "
                        "all of them belong to replies still generating: try again in a moment")
                idle[0].release(f"the cache was released to make room for another chat (at most "
                                f"{self.max_caches} are kept, KVLAB_MAX_CHAT_SESSIONS)")
                holders.remove(idle[0])

    def release(self, key: str) -> bool:
        """Forget the session `key` and free its cache and conversation (its tab closed); True if it was known."""
        with self._guard:
            state = self._states.pop(key, None)
        if state is None:
            return False
        state.stop.set()
        if state.session is not None:
            state.session.clear()
        return True

    def release_state(self, state: ChatTabState | None) -> None:
        """Free `state` wherever it is registered (gradio deletes a closed session's State)."""
        if state is None:
            return
        with self._guard:
            keys = [key for key, known in self._states.items() if known is state]
        for key in keys:
            self.release(key)
        if not keys and state.session is not None:
            state.session.clear()

    def live_caches(self) -> int:
        """How many registered sessions hold a cache now."""
        with self._guard:
            return sum(state.holds_cache for state in self._states.values())
