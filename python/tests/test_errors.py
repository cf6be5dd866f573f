"""Failures: dead owners, bad input, refs that do not fit, and the exceptions that say so."""

import pickle
import signal
import socket
import time

import numpy as np
import pytest

ferry = pytest.importorskip("ferry", reason="ferry is not built (PYTHONPATH=build/python)")

from conftest import HOST, have_torch, time_scale  # noqa: E402


def test_owner_killed_mid_fetch(owner, ctx):
    peer = ctx.connect(owner.refs["np_big"])
    peer.fetch(owner.refs["np_float32"]).result(30)
    owner.child.signal(signal.SIGSTOP)  # the fetches below stay in flight...
    futures = [peer.fetch(owner.refs["np_big"]) for _ in range(4)]
    time.sleep(0.1)
    started = time.monotonic()
    owner.child.kill()  # ...until the owner dies
    for f in futures:
        error = f.exception(timeout=30)
        assert isinstance(error, ferry.ConnectionError), repr(error)
        assert isinstance(error, ConnectionError) and error.scope == "peer"
    assert time.monotonic() - started < 15 * time_scale()
    assert not peer.is_open
    with pytest.raises(ferry.ConnectionError):
        peer.fetch(owner.refs["np_float32"]).result(30)


def test_connect_refused(ctx):
    with socket.socket() as s:  # a port nobody listens on
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    with pytest.raises(ferry.ConnectionError) as info:
        ctx.connect(f"{HOST}:{port}")
    assert isinstance(info.value, ConnectionError) and info.value.scope == "peer"


def test_wrong_secret_is_refused():
    with ferry.Context(f"{HOST}:0", secret="one") as a, ferry.Context(secret="two") as b:
        with pytest.raises(ferry.AuthenticationError):
            b.connect(a.address)
    with ferry.Context(f"{HOST}:0", secret=b"same") as a, ferry.Context(secret="same") as b:
        ref = a.put(np.arange(3))
        assert b.connect(a.address).fetch(ref).result(30).tolist() == [0, 1, 2]


def test_the_environment_gives_the_defaults(monkeypatch):
    # $FERRY_SECRET is the secret of a context made without one; a keyword overrides it.
    monkeypatch.setenv("FERRY_SECRET", "from-the-environment")
    with ferry.Context(f"{HOST}:0") as a:
        ref = a.put(np.arange(3))
        with ferry.Context() as b:
            assert b.connect(a.address).fetch(ref).result(30).tolist() == [0, 1, 2]
        with ferry.Context(secret="another") as c:
            with pytest.raises(ferry.AuthenticationError):
                c.connect(a.address)
        monkeypatch.delenv("FERRY_SECRET")
        with ferry.Context() as d:
            with pytest.raises(ferry.AuthenticationError):
                d.connect(a.address)


def test_ref_of_another_context(local_owner, ctx):
    ref = local_owner.put(np.arange(4))
    with ferry.Context(f"{HOST}:0", name="other") as other:
        other.put(np.arange(4))  # same object id, another owner instance
        peer = ctx.connect(other.address)
        with pytest.raises(ferry.ObjectNotFoundError) as info:
            peer.fetch(ref).result(30)
        assert isinstance(info.value, LookupError) and info.value.scope == "operation"


def test_released_object_is_gone(local_owner, ctx):
    ref = local_owner.put(np.arange(4))
    peer = ctx.connect(ref)
    assert local_owner.release(ref) is True
    assert local_owner.release(ref) is False
    with pytest.raises(ferry.ObjectNotFoundError):
        peer.fetch(ref).result(30)


def test_closed_peer_and_context(local_owner, ctx):
    ref = local_owner.put(np.arange(4))
    peer = ctx.connect(ref)
    peer.close()
    with pytest.raises(ferry.ConnectionError):
        peer.fetch(ref).result(30)
    ctx.close()
    assert ctx.closed
    with pytest.raises(ferry.ContextClosedError):
        ctx.connect(ref)
    with pytest.raises(ferry.ContextClosedError):
        ctx.put(np.arange(3))
    ctx.close()  # idempotent


def test_bad_put_input(local_owner):
    with pytest.raises(TypeError, match="exporting a buffer"):
        local_owner.put(object())
    with pytest.raises(TypeError):
        local_owner.put([np.arange(3), "not a buffer"])
    with pytest.raises(TypeError, match="plain numbers"):
        local_owner.put(np.array([object()]))
    with pytest.raises(ValueError, match="not C-contiguous"):
        local_owner.put(np.arange(20).reshape(4, 5)[:, 1])
    with pytest.raises(ValueError, match="not C-contiguous"):
        local_owner.put(memoryview(bytearray(10))[::2])
    with pytest.raises(ValueError, match="nothing to put"):
        local_owner.put([])
    if have_torch():
        import torch

        with pytest.raises(ValueError, match="not contiguous"):
            local_owner.put(torch.arange(12).reshape(3, 4).t())


def test_bad_fetch_targets(local_owner, ctx):
    ref = local_owner.put(np.arange(8, dtype=np.int32))
    pair = local_owner.put([np.arange(2), np.arange(3)])
    peer = ctx.connect(ref)
    with pytest.raises(ValueError, match="read-only"):
        peer.fetch(ref, into=bytes(32))
    frozen = np.empty(8, dtype=np.int32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        peer.fetch(ref, into=frozen)
    with pytest.raises(ValueError, match="33 bytes, but the tensor has 32"):
        peer.fetch(ref, into=bytearray(33))
    with pytest.raises(ValueError, match="not C-contiguous"):
        peer.fetch(ref, into=np.empty(16, dtype=np.int32)[::2])
    with pytest.raises(ValueError, match="33 bytes, but the tensor has 32"):
        peer.fetch(ref, into=np.empty(33, dtype=np.uint8))
    # Bytes landing on Python object pointers would crash the process: refused, also inside a
    # structured dtype.
    with pytest.raises(TypeError, match="holds Python objects"):
        peer.fetch(ref, into=np.empty(32 // np.dtype(object).itemsize, dtype=object))
    with pytest.raises(TypeError, match="holds Python objects"):
        peer.fetch(ref, into=np.empty(2, dtype=[("a", np.int64), ("b", object)]))
    with pytest.raises(ValueError, match="timeout"):
        peer.fetch(ref, into=np.empty(8, dtype=np.int32), timeout=-1)
    with pytest.raises(ValueError, match="2 buffers for 1 tensors"):
        peer.fetch(ref, into=[bytearray(32), bytearray(32)])
    with pytest.raises(TypeError, match="one per tensor"):
        peer.fetch(pair, into=bytearray(40))
    with pytest.raises(TypeError, match="exporting a buffer"):
        peer.fetch(ref, into=[42])
    with pytest.raises(TypeError, match="ObjectRef"):
        peer.fetch("ferry1:not-a-ref-object")
    with pytest.raises(ValueError, match="timeout"):
        peer.fetch(ref, timeout=-1)
    assert ctx.inflight == 0  # nothing started
    assert peer.fetch(ref).result(30).tolist() == list(range(8))
    # A plain structured dtype of the tensor's size takes the bytes (the general path).
    plain = np.zeros(4, dtype=[("lo", np.int32), ("hi", np.int32)])
    assert peer.fetch(ref, into=plain).result(30) is plain
    assert plain["lo"].tolist() == [0, 2, 4, 6] and plain["hi"].tolist() == [1, 3, 5, 7]


def test_corrupted_refs(local_owner):
    ref = local_owner.put([np.arange(3, dtype=np.float32), np.ones(2, dtype=bool)])
    data = bytes(ref)
    assert ferry.ObjectRef.from_bytes(data) == ref
    for bad in (b"", b"garbage", data[:10], data[:-5], data[:8] + b"\xff" * 20 + data[28:],
                data.replace(b"<f4", b"|O8"), data.replace(b"[3]", b"[4]"),
                data.replace(b'"single":false', b'"single":true')):
        with pytest.raises(ValueError):
            ferry.ObjectRef.from_bytes(bad)
    pickled = pickle.dumps(ref)
    with pytest.raises((ValueError, pickle.UnpicklingError)):
        pickle.loads(pickled.replace(b"<f4", b"<f8"))
    with pytest.raises(ValueError):
        ferry.ObjectRef.from_string("ferry1:@@@")
    with pytest.raises(TypeError):
        ferry.ObjectRef(b"not native")


def test_ref_forms(local_owner):
    import numpy as np

    ref = local_owner.put(np.zeros((2, 3), dtype=np.float16))
    assert pickle.loads(pickle.dumps(ref)) == ref
    assert ferry.ObjectRef.from_bytes(bytes(ref)).tensors == ref.tensors
    text = str(ref)
    assert text.startswith("ferry1:")
    again = ferry.ObjectRef.from_string(text)  # ferry's own description: float16, (2, 3)
    assert again.object_id == ref.object_id and again.owner == ref.owner == local_owner.address
    assert again.tensors[0] == ferry.TensorSpec("numpy", "<f2", (2, 3))
    assert hash(again) == hash(ref)
    assert "ObjectRef(" in repr(ref)


def test_errors_pickle_and_carry_codes():
    info = ferry._ferry._error_info(int(ferry.Errc.peer_closed))
    error = ferry._errors.from_info(info, "fetch")
    assert isinstance(error, ferry.ConnectionError) and error.code == ferry.Errc.peer_closed
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and again.code == error.code and again.scope == "peer"
    assert ferry.Errc.timed_out.name == "timed_out"


def test_bad_context_options():
    with pytest.raises(ValueError):
        ferry.Context(threads=0)
    with pytest.raises(ValueError):
        ferry.Context(rdma_grants="sometimes")
    with pytest.raises(ValueError):
        ferry.Context(rdma_max_registration=-1)
    with pytest.raises(ValueError):
        ferry.Context(rdma_max_registration=1.5)
    for flag in ("busy_poll", "rdma_fork_protection", "cma_preferred"):
        with pytest.raises(ValueError, match=flag):
            ferry.Context(**{flag: "no"})  # would have been true
    with pytest.raises(ValueError):
        ferry.Context(connect_timeout=-1)
    with pytest.raises(ferry.FerryError):
        ferry.Context(transports=["no-such-transport"])
    with pytest.raises(ferry.FerryError):
        ferry.Context(tls=("/nonexistent/cert.pem", "/nonexistent/key.pem", ""))
