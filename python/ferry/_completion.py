"""The completion thread: the one Python thread that hears from ferry.

ferry's io threads never take the GIL. What they must tell Python goes into a C++ queue
(python/src/completions.cc); this daemon thread, started with the first Context, waits on it
with the GIL released and, with the GIL held, resolves fetch futures (running their
done-callbacks) and drops the Python objects ferry held (the arrays behind collected puts).

At interpreter exit (atexit) every open Context is closed, which fails the fetches still in
flight with ContextClosedError; the thread resolves them, then stops, and the threads still
inside ferry calls (a daemon thread waiting on a fetch or a collective) leave them. Each step is
bounded.
"""

import atexit
import logging
import os
import threading
import time
import weakref

from . import _ferry

_log = logging.getLogger("ferry")
_lock = threading.Lock()
_thread = None
_stopped = False
_contexts = weakref.WeakSet()  # open ferry.Context objects, closed at exit

#: How long exit waits for the completion thread to resolve what is left.
EXIT_TIMEOUT = 5.0


def register(context):
    """Starts the completion thread if needed and remembers `context` to close it at exit."""
    global _thread
    with _lock:
        if _stopped:
            raise RuntimeError("ferry has shut down (the interpreter is exiting)")
        if _thread is None:
            _thread = threading.Thread(target=_run, name="ferry-completions", daemon=True)
            _thread.start()
        _contexts.add(context)


_waiting = threading.local()  # .depth: this thread's waits in Fetch.wait() (see resolving())


def in_completion_thread():
    thread = _thread
    return thread is not None and threading.get_ident() == thread.ident


def resolving():
    """Whether this thread may be running done-callbacks for ferry: it is the completion thread,
    or it waits in a future's result() / exception(), which resolves the futures of the fetches
    it finishes meanwhile (their callbacks run there, while the outcome it waits for may be
    held by it, to be resolved next)."""
    return in_completion_thread() or getattr(_waiting, "depth", 0) > 0


class waiting:
    """Marks this thread as waiting in Fetch.wait() while the block runs."""

    def __enter__(self):
        _waiting.depth = getattr(_waiting, "depth", 0) + 1

    def __exit__(self, *exc):
        _waiting.depth -= 1


def _run():
    _ferry._name_this_thread("ferry-complete")  # Python's own name is not the OS's before 3.14
    while True:
        batch = _ferry._wait_completions()  # GIL released while it waits
        if batch is None:
            return
        batch.reverse()  # popped from the end: resolved in completion order
        while batch:
            future, outcome = batch.pop()
            try:
                future._ferry_complete(outcome)
            except BaseException:  # noqa: BLE001 (one bad future must not stop the thread)
                _log.exception("ferry: resolving %r failed", future)
            del future, outcome  # dropped here, not when the next batch arrives


def _shutdown():
    global _stopped
    with _lock:
        _stopped = True
        contexts = list(_contexts)
        thread = _thread
    for context in contexts:
        try:
            context.close()
        except Exception:  # noqa: BLE001
            _log.exception("ferry: closing %r at exit failed", context)
    _ferry._stop_completions()
    if thread is not None and thread is not threading.current_thread():
        thread.join(EXIT_TIMEOUT)
        if thread.is_alive():
            _log.warning("ferry: completion thread still busy %.0f s after exit began "
                         "(a done-callback that blocks?)", EXIT_TIMEOUT)
    # Threads (daemon ones) still inside ferry calls leave them now that their contexts are
    # closed, once they have the GIL back: let them, before the interpreter stops daemon
    # threads, which would end one inside C++ and abort the process.
    deadline = time.monotonic() + EXIT_TIMEOUT
    while _ferry._threads_in_native() > 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    if _ferry._threads_in_native() > 0:
        _log.warning("ferry: %d threads still inside ferry calls %.0f s after exit began",
                     _ferry._threads_in_native(), EXIT_TIMEOUT)


def _after_fork_in_child():
    # The child has no completion thread and none of the parent's io threads: the parent's
    # contexts are unusable there (make new ones; the "spawn" start method avoids the question).
    global _thread, _lock, _contexts
    _lock = threading.Lock()
    _thread = None
    _contexts = weakref.WeakSet()


atexit.register(_shutdown)
os.register_at_fork(after_in_child=_after_fork_in_child)
