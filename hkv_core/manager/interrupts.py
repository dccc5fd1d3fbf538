"""Interrupts deferred while a manager call runs: a Ctrl-C lands before the call or after all of it.

Python runs a signal's handler on the main thread, between two bytecodes of
whatever runs there; Python's SIGINT handler raises KeyboardInterrupt right
there.  A manager call interrupted half-way would leave the tables torn (an
object reserved and not listed, a block indexed and not chained).  Every
locked call of the CacheManager checks its arguments and plans first and
changes state after; `defer()` / `resume()` bracket the whole call, under the
manager's lock, so that no Python-level handler runs inside it:

- On the main thread (elsewhere no signal handler ever runs, so nothing is
  deferred and the call costs nothing more), `defer()` replaces every
  Python-level handler of `DEFERRED` (SIGINT, SIGTERM, SIGALRM) by one that
  only records the signal; `resume()` puts the
  handlers back and then runs each recorded signal's own handler: the
  KeyboardInterrupt (or whatever the handler raises) surfaces after the call
  completed, with the call's whole result applied.  SIG_DFL and SIG_IGN are
  left alone (a default action ends the process; nothing is torn).
- Nested calls (a locked method calling another) defer once.
- A signal that arrives while the handlers are being swapped goes to its own
  handler: it lands before `defer()` finished (nothing changed yet) or after
  `resume()` began (everything was applied).

Cost: on the main thread, one `getsignal` per deferred signal and two
`signal` calls per Python-level handler (the C functions, not the `signal`
module's enum-converting wrappers): well under a microsecond a call.
Asynchronous exceptions raised by other means (`PyThreadState_SetAsyncExc`,
a trace function) are not signals and are not deferred.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

try:  # CPython's C module: getsignal / signal without the enum conversion of the `signal` module's wrappers
    import _signal as _raw  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - another implementation: the wrappers do the same, slower
    _raw = signal

__all__ = ["DEFERRED", "defer", "resume"]

DEFERRED: tuple[int, ...] = tuple(int(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGALRM")
                                  if hasattr(signal, name))  # signals whose Python handlers a call defers

_getsignal: Any = _raw.getsignal
_setsignal: Any = _raw.signal
_get_ident = threading.get_ident


class _State:
    """The main thread's deferral: depth of nested calls, the handlers replaced, the signals recorded."""

    main = threading.main_thread().ident
    depth = 0
    saved: list[tuple[int, Any]] = []  # noqa: RUF012  # (signal, the handler `_record` replaced), until restored
    pending: list[tuple[int, FrameType | None]] = []  # noqa: RUF012  # signals recorded while deferring


def _after_fork() -> None:
    """A forked child's main thread is the thread that forked."""
    _State.main = threading.main_thread().ident
    _State.depth = 0
    _State.pending = []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _original(signum: int) -> Any:
    for number, handler in _State.saved:
        if number == signum:
            return handler
    return None


def _record(signum: int, frame: FrameType | None) -> None:
    """The handler while a call runs: record the signal.  Outside one (a swap that was itself interrupted),
    hand it to the handler it replaced."""
    if _State.depth:
        _State.pending.append((signum, frame))
        return
    original = _original(signum)
    if callable(original):
        original(signum, frame)


def defer() -> bool:
    """Start deferring signal handlers (main thread only); True when `resume()` must be called."""
    state = _State
    if _get_ident() != state.main:
        return False
    if state.depth:
        state.depth += 1
        return True
    for signum in DEFERRED:
        handler = _getsignal(signum)
        if handler is not _record and callable(handler):  # not SIG_DFL / SIG_IGN, nor ours (a stale swap)
            state.saved.append((signum, handler))
            _setsignal(signum, _record)
    state.depth = 1  # only now: a signal during the swap above went to its own handler (nothing changed yet)
    return True


def resume() -> None:
    """End the outermost deferral: put the handlers back, then run the handler of every signal recorded
    meanwhile (Python's SIGINT handler raises KeyboardInterrupt here, after the call's changes)."""
    state = _State
    if state.depth > 1:
        state.depth -= 1
        return
    state.depth = 0  # from here a signal goes to its own handler: the call's changes are all applied
    saved = state.saved
    for signum, handler in saved:
        _setsignal(signum, handler)
    if saved:
        state.saved = []
    if state.pending:
        todo, state.pending = state.pending, []
        originals = dict(saved)
        for signum, frame in dict.fromkeys(todo):  # one run per signal and frame, in order (Python coalesces too)
            handler = originals.get(signum)
            if callable(handler):
                handler(signum, frame)
