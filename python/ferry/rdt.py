"""ferry as a Ray Direct Transport tensor transport: ``FerryTensorTransport``.

    from ray.experimental import register_tensor_transport
    from ferry.rdt import FerryTensorTransport
    register_tensor_transport("FERRY", ["cpu"], FerryTensorTransport, torch.Tensor)

    @ray.remote
    class Trainer:
        @ray.method(tensor_transport="FERRY")
        def weights(self): return self.model_weights      # CPU tensors, zero copy

One-sided: the source actor puts the tensors in its process's ferry context
(``extract_tensor_transport_metadata``) and the metadata Ray ships carries the ferry ref; the
destination reads them (``fetch_multiple_tensors`` / ``wait_fetch_complete``, or
``recv_multiple_tensors``) over RDMA where both sides have it, between actors of one node with one
copy straight out of the source's memory (CMA; ``FERRY_CMA_PREFERRED=0`` turns that off), else over
TCP. Ray never calls
``send_multiple_tensors`` for a one-sided transport. ``garbage_collect`` lets the object go on
its owner; ``abort_transport`` aborts the fetches in flight for an object.

Each process has one ferry context, made on first use (a transport instance is made by Ray with
no arguments, also on processes that never move a tensor, so construction costs nothing). It
listens on ``$FERRY_RDT_HOST`` (default: Ray's node IP address when Ray is installed, else
127.0.0.1), port 0; ``$FERRY_RDT_TIMEOUT`` (seconds, default none) puts a deadline on each fetch;
``FERRY_RDT_CHECKSUM=1`` on the source puts a CRC-32C of each tensor in the metadata, which the
destination checks before the fetch completes (ferry.DataCorruptedError on a difference).
CPU memory only (numpy arrays and torch CPU tensors); a tensor on another device is refused.
"""

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, List, Optional

from ._context import Context
from ._errors import AbortedError, Errc
from ._ref import ObjectRef

try:  # Ray's own interface when Ray is installed: ferry then is a real Ray transport
    from ray.experimental import (CommunicatorMetadata, TensorTransportManager,
                                  TensorTransportMetadata)
    from ray.experimental.rdt.tensor_transport_manager import FetchRequest
    HAVE_RAY = True
except ImportError:  # no Ray: the same interface, from ferry._rdt_interface
    from ._rdt_interface import (CommunicatorMetadata, FetchRequest, TensorTransportManager,
                                 TensorTransportMetadata)
    HAVE_RAY = False

BACKEND = "FERRY"
# How many aborted object ids a process remembers (a fetch started after its object's abort
# fails at once); the oldest are forgotten first.
_ABORTED_LIMIT = 4096


@dataclass(eq=False)
class FerryTransportMetadata(TensorTransportMetadata):
    """TensorTransportMetadata plus the ferry ref of the object (``bytes(ObjectRef)``)."""
    ferry_ref: Optional[bytes] = None


@dataclass(eq=False)
class FerryCommunicatorMetadata(CommunicatorMetadata):
    """ferry needs nothing per send/recv pair: the ref names the owner."""


@dataclass(eq=False)
class FerryFetchRequest(FetchRequest):
    """A fetch in flight: the ferry future behind it. Dropped unwaited, it aborts the fetch."""
    future: Any = field(default=None, repr=False)

    def __del__(self):
        future = self.future
        if future is not None and not future.done():
            future.abort()


class _Process:
    """The process's ferry context, its peers by owner address, the objects it put by Ray
    object id, and the fetches in flight by object id. Thread-safe."""

    def __init__(self):
        self.lock = threading.Lock()
        self.context = None
        self.peers = {}
        self.objects = {}                       # obj_id -> ObjectRef (put here)
        self.fetches = {}                       # obj_id -> WeakSet of Futures in flight
        self.aborted = {}                       # obj_id -> None, insertion-ordered

    def ctx(self):
        with self.lock:
            if self.context is None or self.context.closed:
                host = os.environ.get("FERRY_RDT_HOST") or _node_ip()
                # Actors of one node copy straight out of each other's memory (CMA) unless the
                # environment says otherwise; other nodes' actors use RDMA or TCP.
                prefer = None if "FERRY_CMA_PREFERRED" in os.environ else True
                self.context = Context(listen=f"{host}:0", name=f"ray-rdt-{os.getpid()}",
                                       cma_preferred=prefer)
                self.peers = {}
            return self.context

    def peer(self, owner):
        ctx = self.ctx()
        with self.lock:
            peer = self.peers.get(owner)
        if peer is not None and peer.is_open:
            return peer
        peer = ctx.connect(owner)  # blocking, GIL released; bounded by ferry's timeouts
        with self.lock:
            self.peers[owner] = peer
        return peer


_process = _Process()


def _node_ip():
    if HAVE_RAY:
        try:
            import ray.util
            return ray.util.get_node_ip_address()
        except Exception:  # not in a Ray worker: fall through
            pass
    return "127.0.0.1"


def _fetch_timeout():
    value = os.environ.get("FERRY_RDT_TIMEOUT")
    return float(value) if value else None


def _checksum():
    return os.environ.get("FERRY_RDT_CHECKSUM", "0") not in ("", "0")


def _tensor_meta(tensor):
    """(shape, dtype) as Ray describes a tensor: torch.Size and torch.dtype, or a shape tuple and
    a numpy dtype."""
    if hasattr(tensor, "device") and hasattr(tensor, "dtype") and hasattr(tensor, "shape"):
        if getattr(tensor.device, "type", "cpu") != "cpu":
            raise ValueError(f"ferry.rdt: a tensor on {tensor.device}: ferry moves CPU memory "
                             "only (GPU memory is not supported yet)")
        return (tensor.shape, tensor.dtype)
    return (tuple(tensor.shape), tensor.dtype)


def _actor_has_ferry(actor_self=None):
    """Runs on an actor (through __ray_call__): whether ferry imports there."""
    try:
        import ferry  # noqa: F401
        return True
    except ImportError:
        return False


class FerryTensorTransport(TensorTransportManager):
    """ferry's one-sided transport for Ray Direct Transport (see the module's doc).

    Stateless itself: the process's state lives in the module, so an instance costs nothing to
    make, and the class pickles by reference (or by value with cloudpickle, as Ray ships it).
    """

    def tensor_transport_backend(self) -> str:
        return BACKEND

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor) -> bool:
        """Asks the actor whether it can import ferry (Ray: a __ray_call__ task, 30 s at most).
        Without Ray, `actor` is anything with a ``has_ferry()`` method (the test harness)."""
        if HAVE_RAY and hasattr(actor, "__ray_call__"):
            import ray
            try:
                return bool(ray.get(actor.__ray_call__.remote(_actor_has_ferry), timeout=30))
            except Exception:
                return False
        probe = getattr(actor, "has_ferry", None)
        return bool(probe()) if callable(probe) else False

    def extract_tensor_transport_metadata(self, obj_id: str,
                                          rdt_object: List[Any]) -> FerryTransportMetadata:
        """Puts the tensors in this process's ferry context (zero copy: they stay alive until
        garbage_collect) and returns their metadata with the ref."""
        tensors = list(rdt_object)
        meta = [_tensor_meta(t) for t in tensors]
        ref = _process.ctx().put(tensors, checksum=_checksum())
        with _process.lock:
            _process.objects[obj_id] = ref
        return FerryTransportMetadata(tensor_meta=meta, tensor_device="cpu",
                                      ferry_ref=bytes(ref))

    def get_communicator_metadata(self, src_actor, dst_actor,
                                  backend: Optional[str] = None) -> FerryCommunicatorMetadata:
        return FerryCommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str,
                              tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        request = self.fetch_multiple_tensors(obj_id, tensor_transport_metadata,
                                              communicator_metadata, target_buffers)
        return self.wait_fetch_complete(request, timeout=-1)

    def fetch_multiple_tensors(self, obj_id: str,
                               tensor_transport_metadata: TensorTransportMetadata,
                               communicator_metadata: CommunicatorMetadata,
                               target_buffers: Optional[List[Any]] = None) -> FerryFetchRequest:
        """Starts reading the tensors from their owner (into `target_buffers` when given: one
        per tensor, each exactly its size, else ValueError) and returns at once."""
        ref_bytes = getattr(tensor_transport_metadata, "ferry_ref", None)
        if not ref_bytes:
            raise ValueError("ferry.rdt: the metadata carries no ferry ref (was it made by "
                             "FerryTensorTransport.extract_tensor_transport_metadata?)")
        with _process.lock:
            if obj_id in _process.aborted:
                raise AbortedError(f"ferry.rdt: the transfer of {obj_id} was aborted",
                                   code=Errc.aborted, scope="operation")
        ref = ObjectRef.from_bytes(ref_bytes)
        into = list(target_buffers) if target_buffers is not None else None
        if into is not None and len(into) != len(ref.tensors):
            raise ValueError(f"ferry.rdt: {len(into)} target buffers for {len(ref.tensors)} "
                             "tensors")
        future = _process.peer(ref.owner).fetch(ref, into=into, timeout=_fetch_timeout())
        with _process.lock:
            # An abort_transport() since the check above found no future to abort: this one is
            # aborted here (it still completes, with AbortedError, once ferry lets go of it).
            aborted = obj_id in _process.aborted
            if not aborted:
                _process.fetches.setdefault(obj_id, weakref.WeakSet()).add(future)
        if aborted:
            future.abort()
        future.add_done_callback(lambda f, obj_id=obj_id: _forget_fetch(obj_id, f))
        return FerryFetchRequest(obj_id=obj_id, tensors=[], future=future)

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> List[Any]:
        """The tensors, once read: -1 waits until the fetch ends (ferry bounds it: a dead or
        silent owner fails it), 0 polls, a positive timeout raises TimeoutError when it passes
        (the fetch goes on). Errors of the fetch are ferry's (ferry.FerryError subclasses)."""
        if not isinstance(fetch_request, FerryFetchRequest):
            return fetch_request.tensors
        if timeout is None or timeout == -1:
            wait = None
        elif timeout < 0:
            raise ValueError(f"wait_fetch_complete: timeout must be -1, 0 or positive, got "
                             f"{timeout!r}")
        else:
            wait = float(timeout)
        future = fetch_request.future
        if wait == 0 and not future.done():
            raise TimeoutError(f"ferry.rdt: the fetch of {fetch_request.obj_id} is in flight")
        result = future.result(wait)
        tensors = list(result) if isinstance(result, (list, tuple)) else [result]
        fetch_request.tensors = tensors
        return tensors

    def send_multiple_tensors(self, tensors: List[Any],
                              tensor_transport_metadata: TensorTransportMetadata,
                              communicator_metadata: CommunicatorMetadata):
        raise NotImplementedError("ferry is one-sided (the destination reads the tensors): Ray "
                                  "does not call send_multiple_tensors for it")

    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorTransportMetadata,
                        tensors: List[Any]):
        """Lets the object go on this (the source) process: ferry collects it once no fetch
        reads it; a later fetch of it fails with ferry.ObjectNotFoundError."""
        with _process.lock:
            ref = _process.objects.pop(obj_id, None)
            ctx = _process.context
        if ref is None:
            ref_bytes = getattr(tensor_transport_meta, "ferry_ref", None)
            ref = ObjectRef.from_bytes(ref_bytes) if ref_bytes else None
        if ref is not None and ctx is not None and not ctx.closed:
            ctx.release(ref)  # first: no fetch starts after the abort
            ctx.abort_serving(ref)

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata):
        """Aborts every fetch of `obj_id` in flight in this process (each fails with
        ferry.AbortedError, and ferry lets go of its buffers first) and refuses later ones. On
        the source it withdraws the object (later fetches fail with ObjectNotFoundError) and
        aborts its serves in flight: the destinations' fetches fail with AbortedError."""
        with _process.lock:
            _process.aborted[obj_id] = None
            while len(_process.aborted) > _ABORTED_LIMIT:
                _process.aborted.pop(next(iter(_process.aborted)))
            futures = list(_process.fetches.pop(obj_id, ()))
            ref = _process.objects.pop(obj_id, None)
            ctx = _process.context
        for future in futures:
            future.abort()
        if ref is not None and ctx is not None and not ctx.closed:
            ctx.release(ref)  # first: no fetch starts after the abort
            ctx.abort_serving(ref)

    def __reduce__(self):
        return (FerryTensorTransport, ())


def _forget_fetch(obj_id, future):
    with _process.lock:
        live = _process.fetches.get(obj_id)
        if live is not None:
            live.discard(future)
            if not live:
                del _process.fetches[obj_id]


__all__ = ["BACKEND", "FerryCommunicatorMetadata", "FerryFetchRequest", "FerryTensorTransport",
           "FerryTransportMetadata", "HAVE_RAY"]
