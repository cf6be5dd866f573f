"""ferry.rdt.FerryTensorTransport, driven as Ray Direct Transport drives a one-sided transport.

This process plays Ray's owner (driver): it asks the source actor (a real process,
tests/rdt_actor.py) to extract the metadata of the tensors its task returned, pickles that
metadata across to the destination actor (another process), which fetches and waits (or
receives), and tells the source to garbage-collect. Then the failure paths: the source killed
mid-fetch, an abort from either side, a fetch after garbage collection, target buffers of the
wrong size, bad timeouts. Every wait is bounded.
"""

import inspect
import pickle
import signal
import time

import pytest

from conftest import DEADLINE, HOST, RDMA, have_torch, time_scale

ferry = pytest.importorskip("ferry", reason="ferry is not built (PYTHONPATH=build/python)")
from ferry import rdt  # noqa: E402
from ferry import _rdt_interface  # noqa: E402
from rdt_actor import decode, encode  # noqa: E402

ACTOR = __import__("os").path.join(__import__("os").path.dirname(__file__), "rdt_actor.py")
SHAPES = [(1000,), (64, 33), (0,), (3, 1, 7)]
KINDS = ["numpy"] + (["torch"] if have_torch() else [])


class Actor:
    """A process holding a FerryTensorTransport, as a Ray actor does."""

    def __init__(self, child):
        self.child = child(script=ACTOR)

    def call(self, *cmd, timeout=DEADLINE):
        self.child.send(encode(cmd) + "\n")
        status, value = decode(self.child.read_line(timeout))
        if status == "error":
            raise value
        return value

    def stop(self):
        self.child.signal(signal.SIGSTOP)

    def kill(self):
        self.child.kill()


@pytest.fixture
def actors(child):
    return lambda: Actor(child)


def connect(source, destination):
    """One transfer first, so the destination holds a connection to the source (a fetch that
    must connect to a stopped source fails its handshake instead of staying in flight)."""
    meta, digests = source.call("extract", "warm-up", "numpy", 0, [(10,)])
    assert destination.call("recv", "warm-up", meta, None)[0] == digests


def driver_transport():
    return rdt.FerryTensorTransport()


# ---------------------------------------------------------------- the interface

def test_every_method_of_the_interface_with_its_exact_signature():
    base = rdt.TensorTransportManager
    if not rdt.HAVE_RAY:
        assert base is _rdt_interface.TensorTransportManager
    names = ["tensor_transport_backend", "is_one_sided", "can_abort_transport",
             "actor_has_tensor_transport", "extract_tensor_transport_metadata",
             "get_communicator_metadata", "recv_multiple_tensors", "fetch_multiple_tensors",
             "wait_fetch_complete", "send_multiple_tensors", "garbage_collect", "abort_transport"]
    for name in names:
        ours, theirs = getattr(rdt.FerryTensorTransport, name), getattr(base, name)
        assert list(inspect.signature(ours).parameters) == \
            list(inspect.signature(theirs).parameters), name
    assert isinstance(inspect.getattr_static(rdt.FerryTensorTransport, "is_one_sided"),
                      staticmethod)
    assert isinstance(inspect.getattr_static(rdt.FerryTensorTransport, "can_abort_transport"),
                      staticmethod)
    t = rdt.FerryTensorTransport()  # no arguments, nothing started
    assert t.tensor_transport_backend() == "FERRY"
    assert rdt.FerryTensorTransport.is_one_sided() is True
    assert rdt.FerryTensorTransport.can_abort_transport() is True
    assert issubclass(rdt.FerryTransportMetadata, rdt.TensorTransportMetadata)
    assert issubclass(rdt.FerryFetchRequest, rdt.FetchRequest)
    assert inspect.signature(t.wait_fetch_complete).parameters["timeout"].default == -1
    with pytest.raises(NotImplementedError, match="one-sided"):
        t.send_multiple_tensors([], None, None)


def test_the_class_and_an_instance_pickle_as_ray_ships_them():
    for obj in (rdt.FerryTensorTransport, rdt.FerryTensorTransport()):
        again = pickle.loads(pickle.dumps(obj))
        assert again is rdt.FerryTensorTransport or isinstance(again, rdt.FerryTensorTransport)
    try:
        import cloudpickle
    except ImportError:
        return
    cls = cloudpickle.loads(cloudpickle.dumps(rdt.FerryTensorTransport))
    assert cls().tensor_transport_backend() == "FERRY"


def test_actor_has_tensor_transport_asks_the_actor(actors):
    actor = actors()

    class Handle:  # what the harness gives in place of a Ray ActorHandle
        def has_ferry(self):
            return actor.call("has_ferry")

    assert driver_transport().actor_has_tensor_transport(Handle()) is True
    assert driver_transport().actor_has_tensor_transport(object()) is False


# ---------------------------------------------------------------- the transfer

# Torch actors take a minute to start under the soft-RoCE guest's emulation: there, torch runs
# with targets only (its second fetch, without targets, lands in ferry's memory all the same).
@pytest.mark.parametrize("kind, into", [(kind, into) for into in (False, True) for kind in KINDS
                                        if into or not (RDMA and kind == "torch")])
def test_source_to_destination_through_fetch_and_wait(actors, kind, into):
    source, destination = actors(), actors()
    meta, digests = source.call("extract", "obj-1", kind, 7, SHAPES)
    assert meta.tensor_device == "cpu" and len(meta.tensor_meta) == len(SHAPES)
    comm = driver_transport().get_communicator_metadata(None, None, "FERRY")
    assert isinstance(comm, rdt.CommunicatorMetadata)
    meta = pickle.loads(pickle.dumps(meta))  # as Ray ships it to the destination
    targets = None
    if into:
        targets = [(kind, "bfloat16" if kind == "torch" else "float32", s) for s in SHAPES]
    assert destination.call("fetch", "obj-1", meta, targets) == "started"
    got, used = destination.call("wait", "obj-1", -1)
    assert got == digests
    assert used == into
    # Actors of one host: CMA (ferry.rdt prefers it), but RDMA where both have it (the guest).
    assert destination.call("transport", "obj-1") == ("RDMA" if RDMA else "CMA")
    # Fetched again (a second consumer), then collected on the source: gone for later fetches.
    assert destination.call("recv", "obj-1", meta, None)[0] == digests
    source.call("gc", "obj-1", meta)
    with pytest.raises(ferry.ObjectNotFoundError):
        destination.call("recv", "obj-1", meta, None)


def test_a_source_that_checksums_fails_a_fetch_of_bytes_changed_since(actors):
    """FERRY_RDT_CHECKSUM=1 on the source: the metadata carries each tensor's CRC-32C; the
    destination's fetch of the same bytes succeeds, of bytes changed after extraction fails
    with ferry.DataCorruptedError (through wait_fetch_complete as through recv)."""
    source, destination = actors(), actors()
    source.call("setenv", "FERRY_RDT_CHECKSUM", "1")
    meta, digests = source.call("extract", "obj-c", "numpy", 3, [(1 << 16,), (5,)])
    assert destination.call("recv", "obj-c", meta, None)[0] == digests
    source.call("mutate", "obj-c")
    with pytest.raises(ferry.DataCorruptedError):
        destination.call("recv", "obj-c", meta, None)
    assert destination.call("fetch", "obj-c", meta, None) == "started"
    with pytest.raises(ferry.DataCorruptedError):
        destination.call("wait", "obj-c", -1)
    # Without the variable, nothing is computed or checked: a change goes through.
    source.call("setenv", "FERRY_RDT_CHECKSUM", "0")
    plain, plain_digests = source.call("extract", "obj-p", "numpy", 3, [(10,)])
    source.call("mutate", "obj-p")
    assert destination.call("recv", "obj-p", plain, None)[0] != plain_digests


def test_wait_timeouts_follow_the_interface(actors):
    source, destination = actors(), actors()
    meta, digests = source.call("extract", "obj-t", "numpy", 1, [(1 << 20,)])
    connect(source, destination)
    source.stop()  # the owner cannot answer: the fetch stays in flight
    destination.call("fetch", "obj-t", meta, None)
    with pytest.raises(TimeoutError):
        destination.call("wait", "obj-t", 0)  # 0 polls
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        destination.call("wait", "obj-t", 0.3)
    assert 0.25 <= time.monotonic() - t0 < 10 * time_scale()
    with pytest.raises(ValueError, match="-1, 0 or positive"):
        destination.call("wait", "obj-t", -2)
    source.child.signal(signal.SIGCONT)
    got, _ = destination.call("wait", "obj-t", -1)  # waits until it is done
    assert got == digests


def test_target_buffers_of_the_wrong_size_or_count_are_refused(actors):
    source, destination = actors(), actors()
    meta, _ = source.call("extract", "obj-s", "numpy", 2, [(100,), (10,)])
    with pytest.raises(ValueError):
        destination.call("fetch", "obj-s", meta, [("numpy", "float32", (99,)),
                                                  ("numpy", "float32", (10,))])
    with pytest.raises(ValueError):
        destination.call("fetch", "obj-s", meta, [("numpy", "float32", (100,))])
    with pytest.raises(ValueError, match="no ferry ref"):
        destination.call("fetch", "obj-s", rdt.TensorTransportMetadata(tensor_meta=[]), None)


# ---------------------------------------------------------------- failures

def stuck_fetch(actors, obj_id, seed, nbytes):
    """A source and a destination with a fetch of `obj_id` in flight that cannot progress (the
    source is stopped after the connection is made); returns (source, destination, metadata)."""
    source, destination = actors(), actors()
    meta, _ = source.call("extract", obj_id, "numpy", seed, [(nbytes,)])
    connect(source, destination)
    source.stop()
    destination.call("fetch", obj_id, meta, None)
    return source, destination, meta


def test_source_killed_mid_fetch_fails_the_destination_promptly(actors):
    source, destination, _ = stuck_fetch(actors, "obj-k", 3, 16 << 20)
    t0 = time.monotonic()
    source.kill()
    with pytest.raises(ferry.ConnectionError):
        destination.call("wait", "obj-k", -1)
    assert time.monotonic() - t0 < 15 * time_scale(), "a dead source must fail the fetch in bounds"


def test_abort_on_the_destination_ends_its_fetch_and_refuses_later_ones(actors):
    source, destination, meta = stuck_fetch(actors, "obj-a", 4, 4 << 20)
    t0 = time.monotonic()
    destination.call("abort", "obj-a")
    with pytest.raises(ferry.AbortedError):
        destination.call("wait", "obj-a", 10)
    assert time.monotonic() - t0 < 5 * time_scale()
    with pytest.raises(ferry.AbortedError):
        destination.call("fetch", "obj-a", meta, None)


def test_an_abort_while_the_fetch_starts_is_not_lost(monkeypatch):
    # abort_transport() from another thread between the fetch's check of the aborted ids and its
    # registration found no fetch to abort, and the fetch ran on. Played in this process: the
    # abort runs as the fetch connects to the owner (a context of this process, 64 MiB, so that
    # the fetch is still in flight when it is aborted).
    np = pytest.importorskip("numpy")
    monkeypatch.setenv("FERRY_RDT_HOST", HOST)
    owner = ferry.Context(listen=f"{HOST}:0")
    try:
        ref = owner.put(np.zeros(16 << 20, dtype=np.float32))
        meta = rdt.FerryTransportMetadata(tensor_meta=[], tensor_device="cpu",
                                          ferry_ref=bytes(ref))
        transport, comm = rdt.FerryTensorTransport(), rdt.FerryCommunicatorMetadata()
        real_peer = rdt._process.peer

        def racing_peer(address):
            peer = real_peer(address)
            transport.abort_transport("obj-race", comm)
            return peer

        monkeypatch.setattr(rdt._process, "peer", racing_peer)
        request = transport.fetch_multiple_tensors("obj-race", meta, comm)
        with pytest.raises(ferry.AbortedError):
            transport.wait_fetch_complete(request, 10 * time_scale())
    finally:
        owner.close()


def test_abort_on_the_source_withdraws_the_object(actors):
    source, destination = actors(), actors()
    meta, digests = source.call("extract", "obj-b", "numpy", 5, [(1000,)])
    other, other_digests = source.call("extract", "obj-c", "numpy", 6, [(1000,)])
    source.call("abort", "obj-b")
    with pytest.raises(ferry.ObjectNotFoundError):
        destination.call("recv", "obj-b", meta, None)
    assert destination.call("recv", "obj-c", other, None)[0] == other_digests  # others go on


def test_abort_on_the_source_fails_a_fetch_it_is_serving(actors):
    """Over TCP the destination is stopped (SIGSTOP) so that the source's sending stalls
    mid-object; over RDMA the reads go on in the kernel whoever is stopped, so nobody is, and
    128 MiB over emulated RDMA takes long enough for the abort to land mid-transfer."""
    source, destination = actors(), actors()
    connect(source, destination)
    for attempt in range(5):
        obj_id = f"obj-big-{attempt}"
        meta, digests = source.call("extract", obj_id, "numpy", 20 + attempt, [(128 << 20,)])
        destination.call("fetch", obj_id, meta, None)
        deadline = time.monotonic() + 10
        while source.call("serving") == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        if not RDMA:
            destination.stop()  # its reads stop: the source's sending stalls mid-object
            if source.call("serving") == 0:  # over before it stopped: proves nothing
                destination.child.signal(signal.SIGCONT)
                assert destination.call("wait", obj_id, -1)[0] == digests
                continue
        source.call("abort", obj_id)
        destination.child.signal(signal.SIGCONT)
        t0 = time.monotonic()
        try:
            got = destination.call("wait", obj_id, 60)
        except ferry.AbortedError:
            got = None
        if got is not None:  # every byte had landed before the abort arrived: proves nothing
            assert got[0] == digests
            continue
        assert time.monotonic() - t0 < 30 * time_scale()
        deadline = time.monotonic() + 30
        while source.call("serving") != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert source.call("serving") == 0, "the source still serves what it aborted"
        with pytest.raises(ferry.ObjectNotFoundError):  # withdrawn as well
            destination.call("recv", obj_id, meta, None)
        other, other_digests = source.call("extract", "obj-after", "numpy", 9, [(1000,)])
        assert destination.call("recv", "obj-after", other, None)[0] == other_digests
        return
    pytest.fail("no attempt caught the source serving: 128 MiB moved too fast to abort")


def test_a_corrupted_ref_in_the_metadata_is_a_clear_error(actors):
    source, destination = actors(), actors()
    meta, _ = source.call("extract", "obj-x", "numpy", 8, [(10,)])
    meta.ferry_ref = meta.ferry_ref[:-7] + b"garbage"
    with pytest.raises((ValueError, ferry.FerryError)):
        destination.call("recv", "obj-x", meta, None)


def test_many_transfers_leak_nothing_in_the_destination(actors):
    source, destination = actors(), actors()
    metas = [source.call("extract", f"obj-{i}", "numpy", i, [(4096,)])[0] for i in range(20)]

    def rounds(n):
        for _ in range(n):
            for i, meta in enumerate(metas):
                destination.call("recv", f"obj-{i}", meta, None)

    rounds(5)  # warm-up: the peer, the pool, the interpreter's own caches
    rss0, fds0, _ = destination.call("stats")
    rounds(50)  # 1,000 transfers
    rss1, fds1, tracked = destination.call("stats")
    assert tracked == 0, "finished fetches are still tracked for abort"
    assert fds1 == fds0
    assert rss1 - rss0 < 16 << 20, f"RSS grew by {(rss1 - rss0) >> 20} MiB over 1,000 transfers"
    for i, meta in enumerate(metas):
        source.call("gc", f"obj-{i}", meta)
