"""The executor's write cache: what content went to which file, and when, so that a value already in place is
not written again until ``force_update_seconds`` (flag ``-resource-force-update-seconds``, default 60) have
passed. Bounded (the oldest entry goes first); not locked itself: its writer holds the executor's lock."""

from __future__ import annotations

DEFAULT_FORCE_UPDATE_SECONDS = 60.0
MAX_ENTRIES = 16384


class WriteCache:
    """key (a file's path, or a path with what in it a write is for) → (content, when written)."""

    def __init__(self, force_update_seconds: float = DEFAULT_FORCE_UPDATE_SECONDS,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.force_update_seconds = force_update_seconds
        self._max_entries = max_entries
        self._entries: dict[str, tuple[str, float]] = {}

    def wrote_recently(self, key: str, content: str, now: float) -> bool:
        """``content`` went to ``key`` less than ``force_update_seconds`` ago."""
        cached = self._entries.get(key)
        return cached is not None and cached[0] == content and now - cached[1] < self.force_update_seconds

    def remember(self, key: str, content: str, now: float) -> None:
        """``content`` went to ``key`` at ``now`` (the newest entry: the last to go when the cache is full)."""
        self._entries.pop(key, None)
        self._entries[key] = (content, now)
        if len(self._entries) > self._max_entries:
            del self._entries[next(iter(self._entries))]

    def drop(self, key: str) -> None:
        """Forget ``key``: its next write happens whatever the content."""
        self._entries.pop(key, None)
