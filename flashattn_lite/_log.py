"""Saying what happened: fallbacks counted and announced once, compiles logged on request.

Nothing in the package falls back to another path silently. ``note_fallback`` counts every
fallback by (where, reason), warns once per pair, and ``fallback_counts`` lets a user read the
counters. ``FLASHATTN_LITE_LOG=1`` also logs each first occurrence through the
``flashattn_lite`` logger (INFO), with the first compile of each kernel variant. While
``explain()`` runs a call, fallbacks and dispatch decisions (``note_path``) are also handed to it.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections import Counter

from ._checks import env_flag

logger = logging.getLogger("flashattn_lite")

_lock = threading.Lock()
_fallbacks: Counter = Counter()


class Recorder:
    """What explain() collects while it runs a call: ``items`` is a list inside a
    ``with recorder.recording()`` block and None outside, so a hot path tests one attribute."""
    __slots__ = ("items",)

    def __init__(self):
        self.items: list | None = None

    @contextlib.contextmanager
    def recording(self):
        """Collect into a new list inside the block (this thread's calls and any other's: a
        diagnostic, not for concurrent use); nested blocks each get their own."""
        previous, self.items = self.items, []
        try:
            yield self.items
        finally:
            self.items = previous


_notes = Recorder()  # ("torch fallback" | path, where, reason)
recording = _notes.recording  # every fallback and dispatch note inside the block


def log_enabled() -> bool:
    """``FLASHATTN_LITE_LOG=1`` (read at each call, so tests and users may toggle it)."""
    return env_flag("FLASHATTN_LITE_LOG", False)


def log_once(key, message: str, _seen: set = set()) -> None:
    """Log ``message`` at INFO the first time ``key`` is seen, when logging is enabled."""
    if not log_enabled():
        return
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
    if not logger.handlers and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO)
    logger.setLevel(logging.INFO)
    logger.info(message)


def note_fallback(where: str, reason: str, *, warn: bool = True, detail: str = "") -> None:
    """Count one fallback at ``where`` (e.g. "hf", "replace_sdpa") for ``reason``; the first of each
    (where, reason) pair warns (``warn=True``) and is logged, with ``detail`` (that call's
    particulars, not part of the key) after the reason."""
    with _lock:
        _fallbacks[(where, reason)] += 1
        first = _fallbacks[(where, reason)] == 1
        if _notes.items is not None:
            _notes.items.append(("torch fallback", where, reason))
    if first:
        text = f"{reason} ({detail})" if detail else reason
        if warn:
            warnings.warn(f"flashattn_lite ({where}): falling back: {text}", stacklevel=3)
        log_once(("fallback", where, reason), f"{where}: falling back: {text}")


def note_path(path: str, where: str, reason: str) -> None:
    """A dispatcher chose ``path`` (e.g. "hopper") at ``where`` for ``reason``: told to explain()
    only (a chosen fast path is not news worth a log line)."""
    if _notes.items is not None:
        _notes.items.append((path, where, reason))


def fallback_counts() -> dict:
    """{(where, reason): count} of every fallback so far in this process."""
    with _lock:
        return dict(_fallbacks)


def reset_fallback_counts() -> None:
    with _lock:
        _fallbacks.clear()
