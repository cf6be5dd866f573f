"""ferry.Future: one fetch in flight."""

import asyncio
import concurrent.futures
import math
import time

from . import _completion
from ._errors import from_info
from ._tensors import materialize

# concurrent.futures' state names (module constants there, stable since Python 3.2).
_RUNNING = concurrent.futures._base.RUNNING
_FINISHED = concurrent.futures._base.FINISHED


def _from_outcome(name, doc=None):
    """A read-only property: the fetch's outcome's ``name`` once it is done, None until then."""
    return property(
        lambda self: getattr(self._outcome, name) if self._outcome is not None else None, doc=doc)


class Future(concurrent.futures.Future):
    """One fetch, as a ``concurrent.futures.Future`` that is also awaitable.

    - ``result(timeout=None)`` returns what was fetched (see ``Peer.fetch``) or raises the
      fetch's error (a ``ferry.FerryError``); ``exception()``, ``done()``, ``add_done_callback()``
      and ``concurrent.futures.wait()`` / ``as_completed()`` work as usual.
    - ``await future`` waits inside asyncio without blocking the loop (no polling: the
      completion is handed to the loop with ``call_soon_threadsafe``). Cancelling the awaiting
      task (or ``asyncio.wait_for`` timing out) aborts the fetch, and the cancellation reaches
      the caller once ferry has let go of the fetch's buffers.
    - ``abort()`` asks ferry to stop the fetch; it then completes with ``ferry.AbortedError``
      (or with its result, if that came first). ``cancel()`` does the same and returns False:
      a fetch in flight cannot be cancelled synchronously, because ferry may be writing into its
      buffers until it has stopped; the future completes only once ferry has let them go.
    - ``result()`` / ``exception()`` wait in C++ with the GIL released; when the fetch ends
      while a thread waits there, that thread resolves the future itself (ferry's io thread
      wakes it directly, and no other thread runs). A waiting thread that runs the context's
      loop resolves the other fetches it finishes there too. Otherwise ferry's completion
      thread (one per process) resolves it.
    - Done-callbacks run on the thread that resolves the future: the completion thread, or a
      thread blocked in ``result()`` / ``exception()`` of this future or of another of the same
      context. They may start other fetches and call anything non-blocking; they must not wait
      on another ferry future that is not done (``result()`` there raises RuntimeError instead
      of deadlocking), nor need a lock that code waiting on a ferry future holds.
    """

    def __init__(self, peer, ref, into, keep):
        super().__init__()
        # Running from the start, so cancel() cannot pre-empt it. Set directly: nothing else
        # has seen this future yet (set_running_or_notify_cancel would take its lock).
        self._state = _RUNNING
        self._peer = peer  # keeps the connection (and its Context) open while in flight
        self._ref = ref
        self._into = into
        self._keep = keep  # the target buffers, held until ferry has let them go
        self._request = None
        self._outcome = None

    @property
    def ref(self):
        return self._ref

    transport = _from_outcome(
        "transport", doc='The transport that moved the bytes ("TCP", "RDMA"); None until done.')
    nbytes = _from_outcome("nbytes")

    @property
    def bytes_landed(self):
        """Bytes of the fetch that have landed so far, for progress: moves while it is in flight
        (TCP per chunk, RDMA per completed read), the total once it succeeded, back to where the
        new attempt resumes if it restarts on a new channel."""
        request = self._request
        return request.bytes_landed if request is not None else 0

    elapsed = _from_outcome("elapsed", doc="Seconds from issue to completion; None until done.")
    restarts = _from_outcome("restarts")

    def abort(self):
        """Asks the fetch to stop. Never blocks; the future completes with AbortedError unless
        it completed first."""
        if self._request is not None:
            self._request.abort()

    def cancel(self):
        """Aborts the fetch (see abort()) and returns False: see the class notes."""
        self.abort()
        return super().cancel()  # False: the future is running

    def result(self, timeout=None):
        if self._state == _FINISHED:  # final once set: no lock, no wait
            if self._exception is None:
                return self._result
            try:
                raise self._exception
            finally:
                self = None  # noqa: PLW0642 (no cycle through the traceback, as concurrent.futures)
        self._check_not_deadlocking()
        timeout = self._wait_native(timeout)
        if self._state == _FINISHED and self._exception is None:  # resolved: no lock needed
            return self._result
        return super().result(timeout)

    def exception(self, timeout=None):
        if self._state == _FINISHED:
            return self._exception
        self._check_not_deadlocking()
        return super().exception(self._wait_native(timeout))

    def _wait_native(self, timeout):
        """Waits for the fetch in C++ (GIL released), which resolves the future on this thread
        when the outcome comes to it. Returns the time left of `timeout` for the wait on the
        future itself (which then only waits when another thread resolves it)."""
        request = self._request
        if request is None or self.done():
            return timeout
        with _completion.waiting():
            if timeout is None:
                got = request.wait(-1)
            else:
                start = time.monotonic()
                got = request.wait(max(0, math.ceil(timeout * 1000)))
                timeout = max(0.0, timeout - (time.monotonic() - start))
        if not got:
            return 0  # timed out: the future's own wait says so (or sees it done just now)
        return timeout

    def __await__(self):
        return self._awaited().__await__()

    async def _awaited(self):
        """The fetch's result inside asyncio. Cancelled (the awaiting task, or asyncio.wait_for
        timing out), it aborts the fetch and waits for ferry to let go of its buffers before
        the cancellation goes on: an `into` buffer is the caller's again when it does."""
        completion = asyncio.wrap_future(self)
        try:
            return await asyncio.shield(completion)
        except asyncio.CancelledError:
            self.abort()
            try:
                await completion  # an aborted fetch ends promptly (ferry bounds it)
            except BaseException:  # noqa: BLE001 (its outcome is not what the caller asked)
                pass
            raise

    def _check_not_deadlocking(self):
        if self._state != _FINISHED and _completion.resolving():
            raise RuntimeError(
                "waiting on a ferry future from a done-callback would deadlock: callbacks run "
                "on the thread that resolves futures (the completion thread, or one waiting in "
                "result()), which may be what resolves this one (chain another callback "
                "instead)")

    def _ferry_complete(self, outcome):
        """The fetch ended (FetchOutcome): on the completion thread, or on the thread that
        waited for it in C++ (Fetch.wait). Once per fetch, or again when a signal handler's
        exception interrupted it before it resolved the future."""
        self._outcome = outcome
        peer = self._peer  # kept until resolved: a call interrupted by a signal is made again
        try:
            if outcome.error is not None:
                where = peer.address if peer is not None else "its owner"
                what = f"fetch of object {self._ref.object_id} from {where}"
                self.set_exception(from_info(outcome.error, what))
            elif self._into is not None:
                self.set_result(self._into)
            else:
                tensors = [materialize(spec, view)
                           for spec, view in zip(self._ref.tensors, outcome.views())]
                self.set_result(tensors[0] if self._ref.single else tensors)
        except concurrent.futures.InvalidStateError:
            pass  # already resolved
        except BaseException as e:  # noqa: BLE001 (building the result failed: say so)
            if not self.done():
                self.set_exception(e)
        if self.done():
            self._peer = self._keep = None
        del peer
