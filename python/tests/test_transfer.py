"""Moving tensors between two processes: kinds, dtypes and shapes preserved, both directions,
into ferry's memory and into given buffers."""

import numpy as np
import pytest

ferry = pytest.importorskip("ferry", reason="ferry is not built (PYTHONPATH=build/python)")

from conftest import RDMA, have_torch  # noqa: E402
from ferry_helper import encode, objects, same  # noqa: E402


def test_fetch_every_kind_from_another_process(shared_owner, ctx):
    want = objects(have_torch())
    peer = ctx.connect(next(iter(shared_owner.refs.values())))
    assert peer.is_open and peer.transport
    futures = {name: peer.fetch(ref, timeout=30) for name, ref in shared_owner.refs.items()}
    for name, future in futures.items():
        got = future.result(timeout=60)
        same(want[name], got)
        assert future.transport == peer.transport
        assert future.nbytes == shared_owner.refs[name].nbytes
    assert ctx.inflight == 0


def test_fetch_over_the_same_host_transport(shared_owner, local_owner):
    """CMA: small objects travel in the owner's grant, large ones are copied straight out of the
    owner's memory (here the owner is this process, the fetching context another one in it; the
    helper's objects are small)."""
    want = objects(have_torch())
    with ferry.Context(name="cma-fetcher") as c:
        peer = c.connect(next(iter(shared_owner.refs.values())))
        for name, ref in shared_owner.refs.items():
            future = peer.fetch(ref, timeout=30, transport="CMA")
            same(want[name], future.result(timeout=60))
            assert future.transport == "CMA"
    big = np.arange(3 << 18, dtype=np.float32).reshape(3, -1)  # 3 MiB: several copy shares
    refs = [local_owner.put(big)]
    if have_torch():
        import torch
        refs.append(local_owner.put(torch.arange(1 << 20, dtype=torch.bfloat16)))
    with ferry.Context(name="cma-preferring", cma_preferred=True, cma_copy_threads=2) as c:
        peer = c.connect(refs[0])
        got = peer.fetch(refs[0], timeout=30, transport="CMA").result(60)
        assert np.array_equal(got, big) and got.dtype == big.dtype and got.shape == big.shape
        into = np.empty_like(big)
        future = peer.fetch(refs[0], into=into, transport="CMA")
        assert future.result(60) is into and np.array_equal(into, big)
        assert future.transport == "CMA" and future.bytes_landed == big.nbytes
        if len(refs) > 1:
            t = peer.fetch(refs[1], timeout=30, transport="CMA").result(60)
            assert t.dtype == torch.bfloat16 and torch.equal(t, torch.arange(1 << 20,
                                                                           dtype=torch.bfloat16))
        if not RDMA:  # preferred: "auto" picks it for this host (RDMA, where there, ranks above)
            future = peer.fetch(refs[0], timeout=30)
            future.result(60)
            assert future.transport == "CMA"


def test_dtypes_shapes_survive_the_ref(shared_owner):
    refs = shared_owner.refs
    assert refs["np_float16"].tensors[0] == ferry.TensorSpec("numpy", "<f2", (17,))
    assert refs["np_bool"].tensors[0] == ferry.TensorSpec("numpy", "|b1", (4, 4))
    assert refs["np_scalar"].single and refs["np_scalar"].tensors[0].shape == ()
    assert not refs["list"].single and len(refs["list"].tensors) == 2
    if have_torch():
        assert refs["t_bfloat16"].tensors[0] == ferry.TensorSpec("torch", "bfloat16", (3, 7))


def test_another_process_fetches_what_this_one_put(local_owner, child):
    want = objects(have_torch())
    refs = {name: local_owner.put(value) for name, value in want.items()}
    fetcher = child("fetch")
    fetcher.send(encode(refs))
    line = fetcher.read_line()
    assert line == f"ok {len(refs)}", line
    assert fetcher.wait() == 0


def test_fetch_into_numpy_torch_bytearray_memoryview(shared_owner, ctx):
    peer = ctx.connect(shared_owner.refs["np_float32"])
    want = objects(have_torch())
    target = np.empty((3, 5), dtype=np.float32)
    assert peer.fetch(shared_owner.refs["np_float32"], into=target).result(60) is target
    same(want["np_float32"], target)

    raw = bytearray(shared_owner.refs["bytes"].nbytes)
    assert peer.fetch(shared_owner.refs["bytes"], into=raw).result(60) is raw
    assert bytes(raw) == want["bytes"]

    backing = bytearray(80 * 8)
    view = memoryview(backing)
    peer.fetch(shared_owner.refs["np_int64"], into=view).result(60)
    assert np.frombuffer(backing, dtype=np.int64).tolist() == want["np_int64"].ravel().tolist()

    # a list with one buffer per tensor; a differently typed buffer of the right size is fine
    a, b = np.empty(5, dtype=np.int32), np.empty(4 * 8, dtype=np.uint8)
    out = peer.fetch(shared_owner.refs["list"], into=[a, b]).result(60)
    assert out[0] is a and out[1] is b
    same(want["list"][0], a)
    assert b.view(np.float64).reshape(2, 2).tolist() == want["list"][1].tolist()

    if have_torch():
        import torch

        t = torch.empty(3, 7, dtype=torch.bfloat16)
        assert peer.fetch(shared_owner.refs["t_bfloat16"], into=[t]).result(60)[0] is t
        same(want["t_bfloat16"], t)


def test_fetch_result_views_ferry_memory(shared_owner, ctx):
    peer = ctx.connect(shared_owner.refs["np_big"])
    got = peer.fetch(shared_owner.refs["np_big"]).result(60)
    assert got.base is not None and got.flags.writeable  # a view of ferry's buffer, kept alive
    same(objects(False)["np_big"], got)
    del got  # its memory returns to the receive pool
    assert ctx.pool_stats()["misses"] >= 1
    metrics = ctx.stats()["transport_metrics"]
    if RDMA:  # the pool's regions are registered with the device once, as they are made
        rdma = metrics["RDMA"]
        assert rdma["pool_regions_registered"] >= 1 and rdma["registrations_total"] >= 1, rdma
        assert "ferry_rdma_registrations_total" in ctx.prometheus_text()
    else:
        assert "TCP" not in metrics  # TCP reports no metrics of its own


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_torch_results_share_ferry_memory(shared_owner, ctx):
    import torch

    peer = ctx.connect(shared_owner.refs["t_float16"])
    first = peer.fetch(shared_owner.refs["mixed"]).result(60)
    assert isinstance(first[0], torch.Tensor) and isinstance(first[1], np.ndarray)
    t = first[0]
    t += 1  # writable, ours
    assert t.tolist() == list(range(1, 7))


def test_put_keeps_zero_copy_views(local_owner, ctx):
    array = np.arange(1000, dtype=np.float32)
    ref = local_owner.put(array)
    array[:] = -1  # the store references the array's memory: a fetch sees the change
    got = ctx.connect(ref).fetch(ref).result(60)
    assert (got == -1).all()


def test_put_copy_takes_a_snapshot(local_owner, ctx):
    array = np.arange(10, dtype=np.int16)
    ref = local_owner.put(array, copy=True)
    array[:] = 0
    assert ctx.connect(ref).fetch(ref).result(60).tolist() == list(range(10))


def test_a_checksummed_put_fails_a_fetch_of_changed_bytes(local_owner, ctx):
    """put(checksum=True) puts each tensor's CRC-32C in the ref (it survives pickling); a fetch
    checks what landed: the same bytes pass, changed ones fail with DataCorruptedError, into
    ferry's memory and into a given array alike, unless the fetch says verify=False."""
    import pickle

    array = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    ref = pickle.loads(pickle.dumps(local_owner.put([array, b"tail"], checksum=True)))
    peer = ctx.connect(ref)
    got = peer.fetch(ref).result(60)
    assert np.array_equal(got[0], array) and got[1].tobytes() == b"tail"
    array[12345] += 1  # zero copy: the owner now serves bytes the checksum does not match
    with pytest.raises(ferry.DataCorruptedError) as failure:
        peer.fetch(ref).result(60)
    assert isinstance(failure.value, ferry.FerryError)
    into = [np.empty_like(array), bytearray(4)]
    future = peer.fetch(ref, into=into)
    assert isinstance(future.exception(60), ferry.DataCorruptedError)
    assert np.array_equal(into[0], array)  # what arrived stays where it landed
    assert np.array_equal(peer.fetch(ref, verify=False).result(60)[0], array)
    array[12345] -= 1
    assert np.array_equal(peer.fetch(ref).result(60)[0], array)  # restored: passes again
    plain = local_owner.put(array)  # no checksum: nothing to check, whatever verify says
    array[0] = 7
    assert peer.fetch(plain).result(60)[0] == 7


def test_put_any_contiguous_buffer(local_owner, ctx):
    import array as pyarray

    ref = local_owner.put([b"abc", bytearray(b"defg"), memoryview(b"hi"),
                           pyarray.array("d", [1.5, 2.5])])
    got = ctx.connect(ref).fetch(ref).result(60)
    assert [g.tobytes() for g in got[:3]] == [b"abc", b"defg", b"hi"]
    assert got[3].dtype == np.float64 and got[3].tolist() == [1.5, 2.5]


def test_refs_listed_by_peer_and_context(shared_owner, ctx):
    peer = ctx.connect(shared_owner.refs["bytes"])
    listed = peer.list(timeout=10)
    assert {r.object_id for r in listed} == {r.object_id for r in shared_owner.refs.values()}
    # listed refs carry ferry's description only: still fetchable, as numpy
    by_id = {r.object_id: r for r in listed}
    got = peer.fetch(by_id[shared_owner.refs["np_int64"].object_id]).result(60)
    assert isinstance(got, list) and got[0].dtype == np.int64 and got[0].shape == (2, 4, 10)


def test_many_fetches_in_flight(shared_owner, ctx):
    peer = ctx.connect(shared_owner.refs["np_float32"])
    futures = [peer.fetch(shared_owner.refs["np_float32"]) for _ in range(500)]
    want = objects(False)["np_float32"]
    for f in futures:
        same(want, f.result(timeout=60))
