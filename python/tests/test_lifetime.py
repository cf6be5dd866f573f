"""Lifetimes: what put() keeps alive and until when, no leaks over thousands of fetches, and an
interpreter that exits with fetches in flight."""

import gc
import os
import time
import weakref

import numpy as np
import pytest

ferry = pytest.importorskip("ferry", reason="ferry is not built (PYTHONPATH=build/python)")

from conftest import HOST, time_scale  # noqa: E402
from ferry_helper import encode  # noqa: E402


def eventually(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_put_keeps_the_array_alive_until_collection(local_owner, ctx):
    array = np.arange(100_000, dtype=np.float64)
    alive = weakref.ref(array)
    ref = local_owner.put(array)
    del array
    gc.collect()
    assert alive() is not None  # the store holds it
    peer = ctx.connect(ref)
    got = peer.fetch(ref).result(30)
    assert got[-1] == 99_999.0 and got.sum() == sum(range(100_000))

    peer.hold(ref)  # a remote reference keeps it past the local one
    local_owner.release(ref)
    gc.collect()
    assert alive() is not None
    assert peer.fetch(ref).result(30)[12345] == 12345.0
    peer.release(ref)
    assert eventually(lambda: alive() is None)  # dropped on the completion thread


def test_torch_put_kept_alive():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    with ferry.Context(f"{HOST}:0") as owner, ferry.Context() as ctx:
        t = torch.arange(1000, dtype=torch.float16)
        alive = weakref.ref(t)
        ref = owner.put(t)
        del t
        gc.collect()
        got = ctx.connect(ref).fetch(ref).result(30)
        assert got.dtype == torch.float16 and got[999].item() == 999.0
        assert alive() is not None
        owner.release(ref)
        assert eventually(lambda: alive() is None)


def test_closing_the_owner_drops_what_it_held():
    owner = ferry.Context(f"{HOST}:0")
    arrays = [np.ones(1000) for _ in range(10)]
    alive = [weakref.ref(a) for a in arrays]
    for a in arrays:
        owner.put(a)
    del arrays, a
    owner.close()
    gc.collect()
    assert eventually(lambda: all(w() is None for w in alive))


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_thousands_of_fetches_do_not_leak(local_owner, ctx):
    payload = np.frombuffer(os.urandom(64 << 10), dtype=np.uint8)
    ref = local_owner.put(payload)
    peer = ctx.connect(ref)
    target = np.empty_like(payload)

    def rounds(n):
        for _ in range(n // 100):
            futures = [peer.fetch(ref) for _ in range(90)]
            futures += [peer.fetch(ref, into=target) for _ in range(10)]
            for f in futures:
                f.result(timeout=60)
            # put/release cycles: each drop goes through the completion queue
            for _ in range(10):
                local_owner.release(local_owner.put(np.ones(256)))
        gc.collect()

    rounds(1000)  # warm-up: pools, allocator arenas, caches
    assert eventually(lambda: ferry._ferry._completion_counts()[0] == 0)
    rss, fds, objects = _rss(), _fds(), len(gc.get_objects())
    rounds(4000)
    assert eventually(lambda: ferry._ferry._completion_counts()[0] == 0)
    grown = _rss() - rss
    assert grown < 24 << 20, f"RSS grew by {grown >> 20} MiB over 4000 fetches"
    assert _fds() <= fds + 2, f"open fds: {fds} -> {_fds()}"
    assert len(gc.get_objects()) < objects + 2000, "Python objects pile up"
    assert ctx.inflight == 0
    assert (target == payload).all()


EXIT_SCRIPT = r"""
import os, signal, sys
sys.path.insert(0, {tests!r})
import ferry
from ferry_helper import decode
refs = decode(sys.stdin.readline())
ref = refs["np_big"]
ctx = ferry.Context()
peer = ctx.connect(ref)
peer.fetch(ref).result(30)
os.kill({owner_pid}, signal.SIGSTOP)  # what follows stays in flight
futures = [peer.fetch(ref) for _ in range(50)]
futures += [peer.fetch(ref, into=bytearray(ref.nbytes)) for _ in range(5)]
futures[0].add_done_callback(lambda f: print("callback", type(f.exception()).__name__, flush=True))
owner = ferry.Context(os.environ["FERRY_TEST_HOST"] + ":0")  # and an owner with objects alive at exit
owner.put([bytearray(1000), {extra}])
print("started", flush=True)
"""


@pytest.mark.parametrize("extra", ["bytes(10)", "__import__('numpy').ones(5)"])
def test_exit_with_fetches_in_flight(owner, child, extra):
    tests = os.path.dirname(__file__)
    script = EXIT_SCRIPT.format(tests=tests, owner_pid=owner.pid, extra=extra)
    started = time.monotonic()
    process = child(code=script)
    process.send(encode(owner.refs))
    assert process.read_line() == "started"
    rc = process.wait(timeout=30)
    elapsed = time.monotonic() - started
    out = process.rest()
    assert rc == 0, process.stderr()
    assert "callback ContextClosedError" in out or "callback ConnectionError" in out, out
    assert elapsed < 20 * time_scale()


FORK_SCRIPT = r"""
import os, sys, time
sys.path.insert(0, {tests!r})
import ferry
from ferry_helper import decode
refs = decode(sys.stdin.readline())
ref = refs["np_int64"]
ctx = ferry.Context()
peer = ctx.connect(ref)
peer.fetch(ref).result(30)
pid = os.fork()
if pid == 0:  # the child drops what it inherited as it exits, and closes the context
    started = time.monotonic()
    ctx.close()
    del peer, ctx
    print("child", round(time.monotonic() - started, 3), flush=True)
else:
    _, status = os.waitpid(pid, 0)
    print("child exited", os.waitstatus_to_exitcode(status), flush=True)
    value = peer.fetch(ref).result(30)  # the parent's connection is intact
    print("parent fetched", value.nbytes, flush=True)
"""


def test_a_forked_child_that_closes_an_inherited_context_leaves_the_parents_alone(owner, child):
    script = FORK_SCRIPT.format(tests=os.path.dirname(__file__))
    process = child(code=script)
    process.send(encode(owner.refs))
    rc = process.wait(timeout=60)
    out = process.rest()
    assert rc == 0, process.stderr()
    lines = out.splitlines()
    child_line = next(line for line in lines if line.startswith("child "))
    assert float(child_line.split()[1]) < 2 * time_scale(), out  # no 5 s wait for its threads
    assert "child exited 0" in out, out
    assert any(line.startswith("parent fetched") for line in lines), out
