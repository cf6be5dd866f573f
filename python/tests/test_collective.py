"""ferry.collective: every collective across 2 and 4 rank processes against numpy, a rank that
dies, bad input, the declarative form (this process the driver, 3 rank processes serving), the
docs' example, the GIL and exit. Real processes over loopback TCP (collective_helper.py is a
rank)."""

import inspect
import os
import pickle
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ferry = pytest.importorskip("ferry", reason="ferry is not built (PYTHONPATH=build/python)")
from ferry import collective  # noqa: E402

from collective_helper import (COUNT_RING, RING_OPTIONS, inputs,  # noqa: E402
                               service_inputs)
from conftest import HOST, Child, have_torch, time_scale  # noqa: E402
from ferry_helper import decode, encode  # noqa: E402

HELPER = os.path.join(os.path.dirname(__file__), "collective_helper.py")
DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")


def start_ranks(n, scenario, flags=(), **extra):
    """n rank processes of collective_helper.py, told the group's addresses; [Child]."""
    ranks = [Child(scenario, *flags, script=HELPER) for _ in range(n)]
    try:
        addresses = [c.read_line() for c in ranks]
        for r, c in enumerate(ranks):
            c.send(encode({"addresses": addresses, "rank": r, **extra}))
    except BaseException:
        for c in ranks:
            c.close()
        raise
    return ranks, addresses


# -- every collective, 2 and 4 ranks -----------------------------------------------------------

@pytest.fixture(scope="module")
def suite():
    """suite(n): every rank's results of collective_helper's suite on n ranks (run once per n;
    with torch on 2 ranks where torch imports)."""
    runs = {}

    def get(n):
        if n not in runs:
            flags = ["--torch"] if n == 2 and have_torch() else []
            ranks, _ = start_ranks(n, "suite", flags)
            try:
                runs[n] = [decode(c.read_line()) for c in ranks]
                for c in ranks:
                    assert c.wait() == 0, c.stderr()
            finally:
                for c in ranks:
                    c.close()
        return runs[n]

    return get


def stacked(n, name):
    return np.stack([inputs(r, n)[name] for r in range(n)])


def same_on_every_rank(results, name):
    first = results[0][name]
    for r, result in enumerate(results):
        got = result[name]
        assert got.dtype == first.dtype and got.shape == first.shape, (r, name)
        assert got.tobytes() == first.tobytes(), f"rank {r}'s {name} differs from rank 0's"


@pytest.mark.parametrize("n", [2, 4])
def test_allreduce_float32_sum(suite, n):
    results = suite(n)
    for name in ("f32_small", "f32_large"):
        want = stacked(n, name).sum(axis=0, dtype=np.float64)
        same_on_every_rank(results, name)
        got = results[0][name]
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert not np.array_equal(got, inputs(0, n)[name])  # it did change
    assert all(r["f32_small_returned_same"] for r in results)  # in place, x returned


@pytest.mark.parametrize("n", [2, 4])
def test_allreduce_int32_max_and_uint8_wrapping_sum(suite, n):
    results = suite(n)
    same_on_every_rank(results, "i32_max")
    want = stacked(n, "i32_max").max(axis=0)
    assert results[0]["i32_max"].shape == (7, 11)
    assert np.array_equal(results[0]["i32_max"], want)
    same_on_every_rank(results, "u8_sum")
    assert np.array_equal(results[0]["u8_sum"], stacked(n, "u8_sum").sum(axis=0, dtype=np.uint8))


def test_allreduce_bfloat16_torch(suite):
    if not have_torch():
        pytest.skip("torch is not installed: no bfloat16 tensors to reduce")
    results = suite(2)
    same_on_every_rank(results, "bf16_ints")
    want = stacked(2, "bf16_ints").sum(axis=0).astype(np.float32)  # small integers: exact
    bits = (want.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)  # bfloat16 bits
    assert np.array_equal(results[0]["bf16_ints"], bits)
    kind, shape, values = results[1]["torch_gather"]
    assert (kind, shape) == ("Tensor", (2, 2)) and values.tolist() == [[0, 0], [1, 1]]


@pytest.mark.parametrize("n", [2, 4])
def test_broadcast_from_the_last_rank(suite, n):
    results = suite(n)
    for got in results:
        assert got["bcast"].tobytes() == inputs(n - 1, n)["bcast"].tobytes()
    assert not np.array_equal(inputs(0, n)["bcast"], inputs(n - 1, n)["bcast"])


@pytest.mark.parametrize("n", [2, 4])
def test_allgather_allocates_and_fills_out(suite, n):
    results = suite(n)
    want = stacked(n, "gather")
    for got in results:
        assert got["gather"].shape == (n, 2, 3) and got["gather"].dtype == np.int64
        assert np.array_equal(got["gather"], want)
        assert got["gather_into_given"]
        assert np.array_equal(got["gather_given"], want.ravel())


@pytest.mark.parametrize("n", [2, 4])
def test_reduce_scatter_gives_each_rank_its_chunk(suite, n):
    results = suite(n)
    full = stacked(n, "rs_f64").sum(axis=0)
    mins = stacked(n, "rs_i16").reshape(n, -1).min(axis=0)
    covered = []
    for r, got in enumerate(results):
        first, last = r * 1003 // n, (r + 1) * 1003 // n  # Group::chunk_range
        assert got["rs_range"] == (first, last)
        assert got["rs_f64"].shape == (last - first,)
        np.testing.assert_allclose(got["rs_f64"], full[first:last], rtol=1e-12, atol=1e-12)
        covered.extend(range(first, last))
        f16, l16 = r * 45 // n, (r + 1) * 45 // n
        assert np.array_equal(got["rs_i16"], mins[f16:l16])
    assert covered == list(range(1003))


@pytest.mark.parametrize("n", [2, 4])
def test_ring_path_with_group_options(suite, n):
    results = suite(n)
    same_on_every_rank(results, "f32_ring")
    full = stacked(n, "f32_ring").sum(axis=0, dtype=np.float64)
    np.testing.assert_allclose(results[0]["f32_ring"], full, rtol=1e-5, atol=1e-5)
    for r, got in enumerate(results):
        first, last = r * COUNT_RING // n, (r + 1) * COUNT_RING // n
        np.testing.assert_allclose(got["rs_ring"], full[first:last], rtol=1e-5, atol=1e-5)
    assert RING_OPTIONS["ring_threshold"] < COUNT_RING * 4  # the ring, as the helper meant


@pytest.mark.parametrize("n", [2, 4])
def test_bad_input_raises_before_anything_is_sent(suite, n):
    # Rank 0 made every bad call before the suite; the other ranks made none. Each raised on
    # its own and the group stayed in step: the suite's calls after them all succeeded.
    bad = {what: (kind, message) for what, kind, message in suite(n)[0]["bad"]}
    want = {
        "non-contiguous": ("ValueError", "not C-contiguous"),
        "read-only": ("ValueError", "read-only"),
        "bool": ("TypeError", "cannot reduce bool"),
        "uint32": ("TypeError", "cannot reduce uint32"),
        "byte-swapped": ("TypeError", "cannot reduce >f4"),
        "bad op": ("ValueError", "op must be one of sum, prod, min, max"),
        "bad root": ("ValueError", "root must be a rank"),
        "broadcast read-only": ("ValueError", "read-only"),
        "allgather out size": ("ValueError", f"needs {12 * 4 * n} bytes"),
        "allgather out dtype": ("TypeError", "out is int32, x is float32"),
        "allgather out read-only": ("ValueError", "read-only"),
        "reduce_scatter out size": ("ValueError", f"needs {12 // n * 4} bytes"),
        "reduce_scatter out dtype": ("TypeError", "out is float64, x is float32"),
        "not a buffer": ("TypeError", "expected a numpy array"),
        "allgather out overlaps x": ("ValueError", "out overlaps x"),
        "reduce_scatter out overlaps x": ("ValueError", "out overlaps x"),
    }
    assert set(bad) == set(want)
    for what, (kind, text) in want.items():
        assert bad[what][0] == kind, (what, bad[what])
        assert text in bad[what][1], (what, bad[what])
    for got in suite(n):  # every rank finished the suite
        assert "f32_ring" in got


# -- failure -----------------------------------------------------------------------------------

def test_a_dead_rank_fails_the_others_naming_it():
    n, dead, timeout = 3, 2, 10.0
    ranks, _ = start_ranks(n, "die", dead=dead, timeout=timeout)
    try:
        outcomes = {r: decode(ranks[r].read_line()) for r in range(n) if r != dead}
        assert ranks[dead].wait() == 3
    finally:
        for c in ranks:
            c.close()
    named = False
    for r, o in outcomes.items():
        assert o["raised"] is not None, f"rank {r} finished an allreduce without rank {dead}"
        assert o["collective"], o
        assert o["raised"].startswith("Collective"), o
        assert o["rank"] in range(n) and o["rank"] != r, o
        assert f"failing rank: {o['rank']}" in o["message"], o
        # well before the call's own deadline: the death was heard, not waited out
        assert o["took"] < timeout / 2, o
        assert o["again"] is not None, "a failed group must stay failed"
        named |= o["rank"] == dead
    assert named, f"no survivor named the dead rank {dead}: {outcomes}"


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def test_join_names_the_rank_that_never_came():
    with ferry.Context(f"{HOST}:0") as ctx:
        nobody = f"{HOST}:{free_port()}"
        t0 = time.monotonic()
        with pytest.raises(collective.CollectiveError) as info:
            collective.Group.join(ctx, [ctx.address, nobody], 0, join_timeout=0.5)
        assert time.monotonic() - t0 < 10 * time_scale()
    e = info.value
    assert e.rank == 1 and nobody in str(e)
    assert isinstance(e, ferry.TimeoutError) and isinstance(e, TimeoutError)
    assert e.code == ferry.Errc.timed_out
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is type(e) and again.rank == 1 and again.code == e.code


# -- one process: arguments, lifetimes ---------------------------------------------------------

def test_join_options_default_to_the_cpp_ones():
    params = inspect.signature(collective.Group.join).parameters
    defaults = collective._native.group_defaults()
    assert set(defaults) <= set(params)
    for name, value in defaults.items():
        default = params[name].default
        if isinstance(value, float):
            assert default == pytest.approx(value), name
        else:
            assert default == value, name


def test_join_and_call_argument_errors():
    with ferry.Context(f"{HOST}:0") as ctx, ferry.Context() as quiet:
        with pytest.raises(TypeError):
            collective.Group.join("ctx", [ctx.address], 0)
        with pytest.raises(ValueError, match="rank must be"):
            collective.Group.join(ctx, [ctx.address], 1)
        with pytest.raises(ValueError, match="must listen"):
            collective.Group.join(quiet, [ctx.address], 0)
        with pytest.raises(ValueError, match="timeout"):
            collective.Group.join(ctx, [ctx.address], 0, timeout=0)
        with pytest.raises(ValueError, match="segment_bytes"):
            collective.Group.join(ctx, [ctx.address], 0, segment_bytes=0)
        group = collective.Group.join(ctx, [ctx.address], 0, name="alone")
        assert (group.rank, group.size, group.name) == (0, 1, "alone")
        assert group.chunk_range(10) == (0, 10)
        group.close()
        group.close()  # idempotent
        assert group.closed
        with pytest.raises(ValueError, match="closed"):
            group.allreduce(np.ones(3, dtype=np.float32))


def test_blocking_calls_let_the_gil_go():
    """Two ranks in one process, a thread each: joining and calling block until the other rank
    comes, which it can only do if the first lets the GIL go while it waits."""
    import threading

    contexts = [ferry.Context(f"{HOST}:0") for _ in range(2)]
    addresses = [c.address for c in contexts]
    got, errors = {}, []

    def rank_main(r):
        try:
            with collective.Group.join(contexts[r], addresses, r, join_timeout=10,
                                       timeout=10) as g:
                if r == 1:
                    time.sleep(0.3)  # rank 0 is blocked in its call meanwhile
                got[r] = g.allreduce(np.full(5, r + 1, dtype=np.int64), op="prod")
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    try:
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert got[0].tolist() == got[1].tolist() == [2] * 5
    finally:
        for c in contexts:
            c.close()


def test_one_rank_service_driver_round_trip_and_argument_errors():
    """One rank and its driver in this process: a Service takes the group (the group's own
    calls raise meanwhile) and gives it back when it stops; the Driver checks its refs."""
    with ferry.Context(f"{HOST}:0") as rank_ctx, ferry.Context(f"{HOST}:0") as driver_ctx:
        group = collective.Group.join(rank_ctx, [rank_ctx.address], 0)
        with pytest.raises(ValueError, match="not the one the group was joined on"):
            collective.Service(driver_ctx, group, driver_ctx.address)
        service = collective.Service(rank_ctx, group, driver_ctx.address, name="one")
        with pytest.raises(RuntimeError, match="serving a driver"):
            group.allreduce(np.ones(3, dtype=np.float32))
        with pytest.raises(RuntimeError, match="already serves"):
            collective.Service(rank_ctx, group, driver_ctx.address, name="two")
        mine = rank_ctx.put(np.arange(5, dtype=np.int16))
        two = rank_ctx.put([np.arange(5, dtype=np.int16), np.arange(2.0)])
        u32 = rank_ctx.put(np.arange(5, dtype=np.uint32))
        other = driver_ctx.put(np.arange(5, dtype=np.int16))
        with ferry.Context() as quiet, pytest.raises(ValueError, match="must listen"):
            collective.Driver.create(quiet, [rank_ctx.address])
        with collective.Driver.create(driver_ctx, [rank_ctx.address], name="one",
                                      timeout=10) as driver:
            with pytest.raises(ValueError, match="owned by"):
                driver.allreduce_refs([other])
            with pytest.raises(ValueError, match="2 refs for 1 ranks"):
                driver.allreduce_refs([mine, mine])
            with pytest.raises(TypeError, match="not a ferry.ObjectRef"):
                driver.allreduce_refs([b"ref"])
            with pytest.raises(ValueError, match="holds 2 tensors"):
                driver.allreduce_refs([two])
            with pytest.raises(ValueError, match="op must be one of"):
                driver.allreduce_refs([mine], op="avg")
            with pytest.raises(TypeError, match="cannot reduce"):
                driver.allreduce_refs([u32])
            with pytest.raises(ValueError, match="root must be"):
                driver.broadcast_refs([mine], root=1)
            s = driver.allreduce_refs([mine], op="max")
            assert s.done.result(timeout=30) is None
            got = driver_ctx.connect(s.results[0]).fetch(s.results[0]).result(10)
            assert got.dtype == np.int16 and got.tolist() == [0, 1, 2, 3, 4]
            driver.release(s)
        assert driver.closed
        with pytest.raises(ValueError, match="closed"):
            driver.allreduce_refs([mine])
        service.stop()
        assert service.stopped
        x = np.ones(3, dtype=np.float32)
        assert group.allreduce(x) is x  # the group is ours again
        group.close()


# -- the declarative form: this process drives 3 rank processes --------------------------------

class Served:
    def __init__(self, ctx, driver, addresses, infos):
        self.ctx, self.driver, self.addresses = ctx, driver, addresses
        self.n = len(addresses)
        self.busy = [info["busy"] for info in infos]
        self.refs = {name: [info["refs"][name] for info in infos] for name in infos[0]["refs"]}
        self._peers = {}

    def fetch(self, ref):
        if ref.owner not in self._peers:
            self._peers[ref.owner] = self.ctx.connect(ref.owner)
        return self._peers[ref.owner].fetch(ref, timeout=30).result(60)

    def run(self, submitted):
        """Waits for `submitted`; every rank's result, fetched from that rank."""
        assert submitted.done.result(timeout=60) is None
        assert [ref.owner for ref in submitted.results] == self.addresses
        return [self.fetch(ref) for ref in submitted.results]


@pytest.fixture(scope="module")
def served():
    with ferry.Context(f"{HOST}:0", name="driver") as ctx:
        ranks, addresses = start_ranks(3, "service", driver=ctx.address)
        try:
            infos = [decode(c.read_line()) for c in ranks]
            with collective.Driver.create(ctx, addresses, name="test", timeout=10) as driver:
                yield Served(ctx, driver, addresses, infos)
            for c in ranks:
                c.send("exit\n")
            for c in ranks:
                assert c.wait() == 0, c.stderr()
        finally:
            for c in ranks:
                c.close()


def want_stack(n, name):
    return np.stack([service_inputs(r, n)[name] for r in range(n)])


def test_a_service_takes_its_group(served):
    for busy in served.busy:
        assert "serving a driver" in busy


def test_allreduce_refs_sum_and_max(served):
    n = served.n
    got = served.run(served.driver.allreduce_refs(served.refs["sum"]))
    want = want_stack(n, "sum").sum(axis=0, dtype=np.float64)
    for r, g in enumerate(got):
        assert g.dtype == np.float32 and g.shape == (4, 25)
        assert g.tobytes() == got[0].tobytes(), f"rank {r} differs"
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    # the inputs are left as they were
    assert served.fetch(served.refs["sum"][1]).tobytes() == service_inputs(1, n)["sum"].tobytes()
    got = served.run(served.driver.allreduce_refs(served.refs["max"], op="max"))
    for g in got:
        assert g.dtype == np.int32 and np.array_equal(g, want_stack(n, "max").max(axis=0))


def test_broadcast_refs_takes_the_roots_object(served):
    refs = [None] * served.n
    refs[1] = served.refs["bcast"][1]
    for g in served.run(served.driver.broadcast_refs(refs, root=1)):
        assert g.dtype == np.float64 and g.shape == (2, 5) and (g == 2.0).all()


def test_allgather_refs(served):
    n = served.n
    for g in served.run(served.driver.allgather_refs(served.refs["gather"])):
        assert g.shape == (n, 4) and np.array_equal(g, want_stack(n, "gather"))


def test_reduce_scatter_refs(served):
    n = served.n
    full = want_stack(n, "rs").sum(axis=0)
    s = served.driver.reduce_scatter_refs(served.refs["rs"])
    for r, g in enumerate(served.run(s)):
        first, last = r * 1001 // n, (r + 1) * 1001 // n
        assert s.results[r].tensors[0].shape == (last - first,)
        np.testing.assert_allclose(g, full[first:last], rtol=1e-12, atol=1e-12)


def test_raw_bytes_reduce_as_uint8_or_as_the_dtype_given(served):
    raw = np.frombuffer(service_inputs(0, served.n)["raw"], dtype=np.uint8)
    got = served.run(served.driver.allreduce_refs(served.refs["raw"], op="max"))
    for g in got:  # bytes are described as uint8
        assert g.dtype == np.uint8 and np.array_equal(g, raw)
    got = served.run(served.driver.allreduce_refs(served.refs["raw"], dtype="float32"))
    want = np.arange(64, dtype=np.float32) * served.n
    for g in got:
        assert g.dtype == np.float32 and np.array_equal(g, want)


def test_done_is_awaitable_and_release_drops_the_results(served):
    import asyncio

    s = served.driver.allgather_refs(served.refs["gather"])

    async def wait():
        return await s.done

    assert asyncio.run(wait()) is None
    result = s.results[2]
    assert served.fetch(result).shape == (served.n, 4)
    peer = served.ctx.connect(result.owner)

    def stored():  # rank 2's objects of the result's size (listed refs carry no names)
        return sum(ref.nbytes == result.nbytes for ref in peer.list(timeout=10))

    before = stored()
    assert before >= 1
    served.driver.release(s)
    deadline = time.monotonic() + 20
    while stored() != before - 1:  # asynchronous, in command order
        assert time.monotonic() < deadline, "a released result is still in its rank's store"
        time.sleep(0.05)
    # a fetch by name waits for the name to be offered again: it runs out of time
    with pytest.raises(ferry.TimeoutError):
        peer.fetch(result, timeout=0.3).result(30)


def test_exit_with_everything_open_is_prompt_and_clean():
    """A process that ends with a Group, a Service, a Driver with a submission no rank will
    ever run and an unclosed dropped Driver exits at once, with no native crash at exit."""
    code = """if True:
        import os, numpy as np, ferry
        from ferry import collective
        HOST = os.environ["FERRY_TEST_HOST"]
        rank, drv = ferry.Context(f"{HOST}:0"), ferry.Context(f"{HOST}:0")
        group = collective.Group.join(rank, [rank.address], 0)
        service = collective.Service(rank, group, drv.address, name="served")
        lost = collective.Driver.create(drv, [rank.address], name="nobody", timeout=30)
        s = lost.allreduce_refs([rank.put(np.arange(4, dtype=np.float32))])
        del lost  # dropped unclosed, its submission pending
        kept = collective.Driver.create(drv, [rank.address], name="nobody2", timeout=30)
        t = kept.allreduce_refs([rank.put(np.arange(4, dtype=np.float32))])
        assert not s.done.done() and not t.done.done()
        print("leaving", flush=True)
    """
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "leaving"
    assert "terminate" not in r.stderr and "Fatal" not in r.stderr, r.stderr
    assert time.monotonic() - t0 < 15 * time_scale()


def test_exit_with_a_daemon_thread_inside_a_call_is_prompt_and_clean():
    """A process that ends while a daemon thread waits in an allreduce (the other rank never
    calls) exits at once and cleanly: the exit hook closes the context, which fails the call,
    so no thread is in native code when the interpreter stops its threads."""
    code = """if True:
        import os, threading, time, numpy as np, ferry
        from ferry import collective
        HOST = os.environ["FERRY_TEST_HOST"]
        a, b = ferry.Context(f"{HOST}:0"), ferry.Context(f"{HOST}:0")
        addresses = [a.address, b.address]
        other = []
        t = threading.Thread(target=lambda: other.append(
            collective.Group.join(b, addresses, 1, timeout=30)))
        t.start()
        group = collective.Group.join(a, addresses, 0, timeout=30)
        t.join()
        x = np.ones(1 << 14, dtype=np.float32)
        started = threading.Event()
        def call():
            started.set()
            group.allreduce(x)  # rank 1 never calls: it waits until the exit ends it
        threading.Thread(target=call, daemon=True).start()
        started.wait()
        time.sleep(0.2)
        print("leaving", flush=True)
    """
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "leaving"
    assert "terminate" not in r.stderr and "Fatal" not in r.stderr, r.stderr
    assert time.monotonic() - t0 < 15 * time_scale()


def test_docs_example(tmp_path):
    text = open(DOCS).read()
    block = re.search(r"<!-- python/tests/test_collective.py::test_docs_example[^\n]*-->\n"
                      r"```python\n(.*?)```", text, re.S)
    assert block, "docs/python.md lost its collectives example"
    code = block.group(1)
    for port in ("29500", "29501", "29600"):
        assert f"127.0.0.1:{port}" in code
        code = code.replace(f"127.0.0.1:{port}", f"{HOST}:{free_port()}")
    script = tmp_path / "collective_example.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"


# Last: it fails the ranks' groups for good (ranks 1 and 2 time out waiting for rank 0).
def test_a_failing_rank_fails_done_naming_it(served):
    # Rank 0, the first the driver hears from, fails at once: its report names itself. (Had
    # another rank failed, the report could name a rank that heard of it: rank 0 then blames
    # whichever rank's failure reached it first.)
    refs = list(served.refs["sum"])
    refs[0] = served.refs["gone"][0]  # rank 0 has no such object any more
    t0 = time.monotonic()
    s = served.driver.allreduce_refs(refs)
    e = s.done.exception(timeout=60)
    assert isinstance(e, collective.CollectiveError), e
    assert e.rank == 0 and "failing rank: 0" in str(e), e
    assert isinstance(e, ferry.AbortedError)  # the driver's code for a rank's failure
    assert time.monotonic() - t0 < 10  # heard at once, not at the driver's 10 s per rank
    with pytest.raises(collective.CollectiveError):
        s.done.result(0)
