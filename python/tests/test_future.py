"""ferry.Future: concurrent.futures behaviour, asyncio, callbacks, abort, cancel, timeouts.

A stopped owner (SIGSTOP) makes a fetch that surely stays in flight: what is asserted about
abort, timeout and dropped futures does not race the fetch's own completion."""

import asyncio
import concurrent.futures
import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ferry = pytest.importorskip("ferry", reason="ferry is not built (PYTHONPATH=build/python)")

from conftest import HOST, time_scale  # noqa: E402
from ferry_helper import objects, same  # noqa: E402


@pytest.fixture
def stopped(owner, ctx):
    """(peer, ref) where the owner process is stopped: fetches stay in flight until SIGCONT."""
    peer = ctx.connect(owner.refs["np_float32"])
    peer.fetch(owner.refs["np_float32"]).result(30)  # the data channel is up
    owner.child.signal(signal.SIGSTOP)
    yield peer, owner.refs["np_float32"]
    owner.child.signal(signal.SIGCONT)


def test_is_a_concurrent_future(owner, ctx):
    peer = ctx.connect(owner.refs["np_int64"])
    futures = [peer.fetch(owner.refs["np_int64"]) for _ in range(8)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    done, not_done = concurrent.futures.wait(futures, timeout=60)
    assert not not_done
    for f in concurrent.futures.as_completed(futures, timeout=60):
        assert f.done() and f.exception() is None
        assert f.elapsed > 0 and f.restarts == 0


def test_await_in_asyncio(owner, ctx):
    peer = ctx.connect(owner.refs["np_int64"])
    want = objects(False)

    async def main():
        ticks = 0

        async def ticker():  # the loop keeps running while fetches are awaited
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        single = await asyncio.wait_for(peer.fetch(owner.refs["np_int64"]), 60)
        many = await asyncio.wait_for(
            asyncio.gather(*(peer.fetch(owner.refs["list"]) for _ in range(20))), 60)
        task.cancel()
        return single, many, ticks

    single, many, ticks = asyncio.run(main())
    same(want["np_int64"], single)
    for m in many:
        same(want["list"], m)
    assert ticks > 0


def test_cancelling_an_awaiting_task_aborts_the_fetch(stopped):
    peer, ref = stopped
    future = peer.fetch(ref)

    async def main():
        task = asyncio.ensure_future(future)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    with pytest.raises(ferry.AbortedError):
        future.result(timeout=30)


def test_a_timed_out_await_returns_once_ferry_has_let_go_of_the_buffer(stopped):
    # asyncio.wait_for cancels the await when it times out: the fetch is aborted, and the
    # TimeoutError comes once it has ended, so the caller may reuse `into` at once.
    peer, ref = stopped
    into = np.empty(objects(False)["np_float32"].shape, dtype=np.float32)
    future = peer.fetch(ref, into=into)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(future, 0.05)
        return future.done()

    assert asyncio.run(main()), "the await ended while ferry could still write into `into`"
    with pytest.raises(ferry.AbortedError):
        future.result(timeout=0)


@pytest.mark.parametrize("idle_spin", [None, 0.0, 0.002])
def test_done_callback_fetches_again(owner, idle_spin):
    """A chain of fetches, each issued from the callback of the one before, with the io
    thread's spin as the machine's default (None), off (it sleeps as soon as it is idle, and each
    fetch wakes it) and long (the next fetch finds it polling)."""
    ref = owner.refs["np_float16"]
    with ferry.Context(name="chain", idle_spin=idle_spin) as ctx:
        peer = ctx.connect(ref)
        results, finished = [], threading.Event()

        def chain(future):
            results.append(future.result())  # done: returns at once
            if len(results) < 20:
                peer.fetch(ref).add_done_callback(chain)
            else:
                finished.set()

        peer.fetch(ref).add_done_callback(chain)
        assert finished.wait(60)
    want = objects(False)["np_float16"]
    for r in results:
        same(want, r)


@pytest.mark.parametrize("spin", [-1e-6, 0.02, "1", True])
def test_idle_spin_is_checked(spin):
    with pytest.raises(ValueError, match="idle_spin"):
        ferry.Context(idle_spin=spin)


def test_waiting_inside_a_callback_raises_instead_of_deadlocking(stopped):
    peer, ref = stopped
    seen, called = [], threading.Event()

    def callback(_):
        inner = peer.fetch(ref)  # stays in flight: the owner is stopped
        try:
            inner.result(timeout=1)
        except RuntimeError as e:
            seen.append(e)
        inner.abort()
        called.set()

    first = peer.fetch(ref)
    first.add_done_callback(callback)
    first.abort()
    assert called.wait(30)
    assert seen and "deadlock" in str(seen[0])


def test_a_callback_run_inside_result_that_waits_on_that_result_does_not_deadlock(stopped):
    # The thread waiting in a.result() runs the loop; the peer's close fails a and b in one
    # handler there, and b's callback runs on that thread before a is resolved, which only that
    # thread can do: waiting on a in it must raise, not wait (for good, or until its timeout).
    peer, ref = stopped
    a, b = peer.fetch(ref), peer.fetch(ref)
    seen = []

    def callback(_):
        try:
            seen.append(a.exception(timeout=5 * time_scale()))
        except BaseException as e:  # noqa: BLE001 (what it raised is the test's subject)
            seen.append(e)

    b.add_done_callback(callback)
    threading.Timer(0.3, peer.close).start()
    t0 = time.monotonic()
    assert isinstance(a.exception(timeout=30 * time_scale()), ferry.FerryError)
    assert time.monotonic() - t0 < 3 * time_scale()
    assert len(seen) == 1
    assert not isinstance(seen[0], TimeoutError), seen[0]
    if isinstance(seen[0], RuntimeError):
        assert "deadlock" in str(seen[0])


def test_abort(stopped):
    peer, ref = stopped
    future = peer.fetch(ref)
    time.sleep(0.05)
    assert not future.done()
    future.abort()
    with pytest.raises(ferry.AbortedError) as info:
        future.result(timeout=30)
    assert info.value.code == ferry.Errc.aborted and info.value.scope == "operation"
    # Finished: every later call answers at once, with the same error.
    assert future.exception(timeout=0) is info.value
    with pytest.raises(ferry.AbortedError) as again:
        future.result(timeout=0)
    assert again.value is info.value
    assert peer.is_open  # the peer stays usable


def test_cancel_aborts_and_reports_running(stopped):
    peer, ref = stopped
    future = peer.fetch(ref)
    assert future.cancel() is False  # a fetch in flight cannot be cancelled synchronously
    assert isinstance(future.exception(timeout=30), ferry.AbortedError)
    assert not future.cancelled()


def test_timeout(stopped):
    peer, ref = stopped
    started = time.monotonic()
    future = peer.fetch(ref, timeout=0.3)
    with pytest.raises(ferry.TimeoutError) as info:
        future.result(timeout=30)
    assert isinstance(info.value, TimeoutError)  # the built-in
    assert info.value.code == ferry.Errc.timed_out
    assert 0.25 < time.monotonic() - started < 10 * time_scale()


def test_result_timeout_is_the_waits_own(stopped):
    peer, ref = stopped
    future = peer.fetch(ref)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.result(timeout=0.1)
    assert not future.done()  # the fetch goes on
    future.abort()
    assert isinstance(future.exception(timeout=30), ferry.AbortedError)


def test_dropped_futures_still_complete(owner, ctx):
    peer = ctx.connect(owner.refs["np_big"])
    into = np.empty_like(objects(False)["np_big"])
    for _ in range(10):
        peer.fetch(owner.refs["np_big"])  # dropped at once
    peer.fetch(owner.refs["np_big"], into=into)  # dropped too: the target stays alive meanwhile
    del peer
    gc.collect()
    deadline = time.monotonic() + 60
    while ctx.inflight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ctx.inflight == 0
    same(objects(False)["np_big"], into)


def test_closing_the_context_fails_fetches_in_flight(stopped):
    peer, ref = stopped
    futures = [peer.fetch(ref) for _ in range(5)]
    peer._context.close()
    for f in futures:
        error = f.exception(timeout=30)
        assert isinstance(error, ferry.FerryError), error
        assert error.scope in ("peer", "context")


def test_blocking_calls_let_other_threads_run(stopped):
    peer, ref = stopped
    ticks, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        with pytest.raises(ferry.TimeoutError):
            peer.hold(ref, timeout=0.5)  # the owner is stopped: no answer
    finally:
        stop.set()
        spinner.join(10)
    assert ticks[0] > 1000  # the spinner ran while hold() waited


def test_a_waiting_thread_is_handed_the_outcome_directly(owner, ctx):
    """result() waits in C++: a fetch that ends while a thread waits there wakes that thread
    (which resolves the future) and not ferry's completion thread; callbacks registered first
    still run, once."""
    from ferry import _ferry
    ref = owner.refs["np_big"]
    peer = ctx.connect(ref)
    want = objects(False)["np_big"]
    into = np.empty_like(want)
    peer.fetch(ref, into=into).result(60)  # the data channel is up
    n = 50
    queued = _ferry._completion_counts()[1]
    for _ in range(n):
        assert peer.fetch(ref, into=into).result(60) is into
    direct = n - (_ferry._completion_counts()[1] - queued)
    # A fetch that ended before result() was called goes through the completion thread.
    assert direct >= n // 2, f"only {direct} of {n} outcomes reached their waiting thread"
    same(want, into)
    ran = []
    future = peer.fetch(ref)
    future.add_done_callback(lambda f: ran.append(threading.current_thread().name))
    same(want, future.result(60))
    deadline = time.monotonic() + 30
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(ran) == 1


def test_a_waiting_thread_resolves_the_other_fetches_it_finishes(owner):
    """A thread blocked in result() runs the loop; the other fetches that end there, which no
    thread waits for, are resolved by that thread too (their callbacks run on it, once each),
    not queued for the completion thread. A long linger keeps the io threads parked between
    the waits, so every completion below happens inside one."""
    from ferry import _ferry
    ref = owner.refs["np_float32"]
    want = objects(False)["np_float32"]
    with ferry.Context(name="collects", wait_linger=1.0) as c:
        peer = c.connect(ref)
        peer.fetch(ref).result(60)  # connected, data channel up; the io threads park now
        queued = _ferry._completion_counts()[1]
        ran = []
        others = [peer.fetch(ref) for _ in range(20)]
        for f in others:
            f.add_done_callback(lambda f: ran.append(threading.current_thread()))
        last = peer.fetch(ref)
        same(want, last.result(60))
        assert _ferry._completion_counts()[1] == queued, "a completion went through the queue"
        for f in others:
            same(want, f.result(60))
        assert len(ran) == len(others)
        assert all(t is threading.current_thread() for t in ran), {t.name for t in ran}


def test_several_threads_wait_on_one_future(owner, ctx):
    ref = owner.refs["np_float32"]
    peer = ctx.connect(ref)
    peer.fetch(ref).result(60)  # the data channel is up
    owner.child.signal(signal.SIGSTOP)
    try:
        future = peer.fetch(ref)
        results, errors = [], []

        def wait():
            try:
                results.append(future.result(60))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=wait) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        with pytest.raises(concurrent.futures.TimeoutError):  # a short wait beside them
            future.result(timeout=0.05)
    finally:
        owner.child.signal(signal.SIGCONT)
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 4
    assert all(r is results[0] for r in results)  # one resolution, the same result for all
    same(objects(False)["np_float32"], results[0])


def test_bytes_landed_reach_the_total(owner, ctx):
    ref = owner.refs["np_big"]
    peer = ctx.connect(ref)
    future = peer.fetch(ref)
    seen = [future.bytes_landed]
    while not future.done():
        seen.append(future.bytes_landed)
        time.sleep(0.0005)
    future.result(60)
    assert seen == sorted(seen), "progress went back"
    assert future.bytes_landed == future.nbytes == objects(False)["np_big"].nbytes


@pytest.mark.parametrize("runs_loop,linger,spin", [(True, 500e-6, 0.0), (True, 0.0, 0.0),
                                                   (True, 500e-6, 0.002), (False, 0.0, 0.0),
                                                   (False, 0.0, 0.002)])
def test_a_loop_of_waits_in_each_wait_mode(owner, runs_loop, linger, spin):
    """wait_runs_loop: the waiting thread runs the context's loop (its io threads park, for
    `wait_linger` after each wait too), polling for `idle_spin` before it sleeps in the reactor;
    False: it sleeps until the io thread (spinning or not) hands it the outcome. Either way every
    fetch of a loop of fetch().result() lands whole."""
    ref = owner.refs["np_big"]
    want = objects(False)["np_big"]
    with ferry.Context(name="wait-mode", wait_runs_loop=runs_loop, wait_linger=linger,
                       idle_spin=spin) as c:
        peer = c.connect(ref)
        into = np.empty_like(want)
        for _ in range(100):
            into[:] = 0
            assert peer.fetch(ref, into=into).result(60) is into
            same(want, into)
        same(want, peer.fetch(ref).result(60))  # into ferry's memory


def test_a_thread_waiting_in_the_loop_serves_its_own_peers(local_owner):
    """Two contexts in one process fetch from each other at once, each from a thread blocked in
    result(): while a thread runs its context's loop (the io threads parked), requests for what
    that context owns are served by it; nothing waits on a parked thread."""
    data = {name: np.arange(1 << 16, dtype=np.float64) * k for k, name in enumerate("ab", 1)}
    with ferry.Context(f"{HOST}:0", name="wait-b") as other:
        refs = {"a": local_owner.put(data["a"]), "b": other.put(data["b"])}
        errors = []

        def fetch_loop(ctx, name):
            try:
                peer = ctx.connect(refs[name])
                for _ in range(200):
                    same(data[name], peer.fetch(refs[name]).result(60))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=fetch_loop, args=(local_owner, "b")),
                   threading.Thread(target=fetch_loop, args=(other, "a"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a fetch loop hung"
        assert not errors, errors


def test_closing_the_context_ends_a_wait_that_runs_its_loop(stopped):
    peer, ref = stopped
    future = peer.fetch(ref)
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(future.exception(timeout=60)))
    waiter.start()
    time.sleep(0.2)  # the waiter runs the loop now (the owner is stopped: nothing completes)
    started = time.monotonic()
    peer._context.close()
    waiter.join(30)
    assert not waiter.is_alive(), "the wait outlived the context's close"
    assert isinstance(outcome[0], ferry.FerryError), outcome
    assert outcome[0].scope in ("peer", "context")
    assert time.monotonic() - started < 15 * time_scale()


@pytest.mark.parametrize("linger", [-1e-3, 2.0, "1"])
def test_wait_linger_is_checked(linger):
    with pytest.raises(ValueError, match="wait_linger"):
        ferry.Context(wait_linger=linger)


def test_the_completion_thread_resolves_a_batch_in_completion_order(monkeypatch):
    """The queue hands over completions in the order they happened; callbacks run in it."""
    from ferry import _completion

    heard = []

    class Probe:
        def __init__(self, i):
            self.i = i

        def _ferry_complete(self, outcome):
            heard.append((self.i, outcome))

    batches = [[(Probe(i), f"outcome {i}") for i in range(5)], [(Probe(5), "outcome 5")], None]

    class NativeQueue:  # stands in for _ferry's queue: two batches, then stopped
        @staticmethod
        def _wait_completions():
            return batches.pop(0)

        @staticmethod
        def _name_this_thread(name):
            pass

    monkeypatch.setattr(_completion, "_ferry", NativeQueue)
    _completion._run()  # returns once the queue says it stopped
    assert heard == [(i, f"outcome {i}") for i in range(6)]


def test_the_completion_thread_has_its_name_in_the_os(owner, ctx):
    """top -H, gdb and perf show ferry's Python thread by name, as they show its C++ ones."""
    from ferry import _completion

    peer = ctx.connect(owner.refs["np_int64"])
    peer.fetch(owner.refs["np_int64"]).result(60)  # the completion thread has run
    with open(f"/proc/self/task/{_completion._thread.native_id}/comm") as comm:
        assert comm.read().strip() == "ferry-complete"
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as comm:
        assert comm.read().strip() != "ferry-complete", "the caller's thread was renamed"


@pytest.mark.parametrize("spin", ["0", "50", "10000", "lots"])
def test_the_completion_threads_spin_setting(spin):
    """FERRY_COMPLETION_SPIN_US (read once per process: a fresh interpreter each): callbacks that
    fetch again complete with any setting; one that is not 0 to 10000 is logged and the default
    used."""
    code = """
import threading, numpy as np, ferry
with ferry.Context(listen="127.0.0.1:0") as owner, ferry.Context() as me:
    ref = owner.put(np.arange(16, dtype=np.int64))
    peer = me.connect(ref)
    left = [200]
    done = threading.Event()
    def again(f):
        assert f.result().tolist() == list(range(16))
        left[0] -= 1
        if left[0]:
            peer.fetch(ref).add_done_callback(again)
        else:
            done.set()
    peer.fetch(ref).add_done_callback(again)
    print("done" if done.wait(60) else "stuck", flush=True)
"""
    env = dict(os.environ, FERRY_COMPLETION_SPIN_US=spin)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "done"
    warned = "FERRY_COMPLETION_SPIN_US=lots is not 0 to 10000" in r.stderr
    assert warned == (spin == "lots"), r.stderr[-2000:]


def test_a_signal_handler_that_raises_during_result_loses_no_outcome(stopped, owner):
    # The outcome reaches the thread waiting in result() in C++, where no signal handler runs; a
    # handler's exception raised as Python code resumes must neither lose the outcome (the future
    # stayed unresolved for good, and every later result() waited in vain) nor be swallowed.
    peer, ref = stopped
    future = peer.fetch(ref)

    class Boom(Exception):
        pass

    def handler(signum, frame):
        raise Boom()

    def later():
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGUSR1)  # handled once the fetch has ended
        time.sleep(0.1)
        owner.child.signal(signal.SIGCONT)

    old = signal.signal(signal.SIGUSR1, handler)
    thread = threading.Thread(target=later)
    thread.start()
    try:
        with pytest.raises(Boom):
            future.result(30 * time_scale())
    finally:
        thread.join()
        signal.signal(signal.SIGUSR1, old)
    assert future.done()
    same(objects(False)["np_float32"], future.result(0))
