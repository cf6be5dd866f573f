"""ferry.collective: allreduce, broadcast, allgather and reduce-scatter across processes.

Imperative, on every rank (like MPI / torch.distributed)::

    ctx = ferry.Context(listen=addresses[rank])
    with ferry.collective.Group.join(ctx, addresses, rank) as group:
        group.allreduce(grads)                       # in place, numpy or torch CPU
        everyone = group.allgather(x)                # shape (group.size, *x.shape)

Declarative, from a driver (refs in, refs out; the ranks run a Service each)::

    service = ferry.collective.Service(ctx, group, driver_address)          # every rank
    driver = ferry.collective.Driver.create(driver_ctx, addresses)          # the driver
    s = driver.allreduce_refs(refs)       # refs[r]: an object in rank r's store
    s.done.result(timeout=30)             # None, or the CollectiveError
    array = driver_ctx.connect(s.results[0]).fetch(s.results[0]).result(10)
    driver.release(s)

The engine is ferry's C++ one (ferry/collective/group.h, ferry/collective/service.h, docs/collectives.md):
the ranks fetch from each other over TCP or RDMA, zero copy, every rank gets bit-identical
results. See docs/python.md, "Collectives".
"""

import asyncio
import atexit
import concurrent.futures
import threading
import weakref
from typing import List, NamedTuple, Optional

import numpy as np

from . import _ferry
from ._context import Context, _milliseconds, _seconds_to
from ._errors import _SUBCLASSES, FerryError, from_info
from ._ref import ObjectRef
from ._tensors import _FERRY_DTYPES, TensorSpec, _torch_module, source, target

_native = _ferry.collective

#: The reduction ops (ferry::collective::ReduceOp), by the name the calls take.
OPS = ("sum", "prod", "min", "max")
# ferry::DType values the reductions cover (ferry/collective/reduce.h: every one but bool).
_REDUCIBLE = {_FERRY_DTYPES[n] for n in ("uint8", "int8", "int16", "int32", "int64", "float16",
                                         "bfloat16", "float32", "float64")}
_DTYPE_NAMES = {v: k for k, v in _FERRY_DTYPES.items()}
# How long a waiter thread waits in C++ at a time before it looks whether ferry is shutting down.
_WAIT_SLICE_MS = 200


# -- errors ------------------------------------------------------------------------------------

class CollectiveError(FerryError):
    """A collective failed (ferry::collective::Status).

    Raised as a class that is also the ferry error of its code: a collective that timed out
    raises ``CollectiveTimeoutError``, which is a ``CollectiveError``, a ``ferry.TimeoutError``
    and a builtin ``TimeoutError``; one whose peer died, a ``CollectiveConnectionError`` (a
    ``ferry.ConnectionError``), and so on.

    Attributes (besides FerryError's ``code``, ``category``, ``scope``, ``message``):
        rank: the rank the failure came from, as ferry names it: the dead or failing rank, this
            rank's own number for a local failure (a size mismatch on this side, ...), or None
            where no rank is to blame (a driver that could not offer its command).
    """

    def __init__(self, message, *, code=None, category="ferry", scope="none", rank=None):
        super().__init__(message, code=code, category=category, scope=scope)
        self.rank = rank

    def __reduce__(self):  # keeps rank, code and scope across pickling
        return (_rebuild, (type(self), self.message, self.code, self.category, self.scope,
                           self.rank))


def _rebuild(cls, message, code, category, scope, rank):
    return cls(message, code=code, category=category, scope=scope, rank=rank)


def _collective_class(base):
    name = "Collective" + base.__name__
    cls = type(name, (CollectiveError, base), {
        "__module__": __name__, "__qualname__": name,
        "__doc__": f"A collective failed with ferry.{base.__name__} (see CollectiveError)."})
    globals()[name] = cls  # importable by name: pickling finds it
    return cls


# ferry's error class -> the CollectiveError subclass that is also that class.
_BY_BASE = {FerryError: CollectiveError}
for _base in _SUBCLASSES:
    _BY_BASE[_base] = _collective_class(_base)
del _base


def _status_error(status, what, local_rank=None):
    """The CollectiveError for a native status (error_info, rank, message)."""
    info, rank, message = status
    base = from_info(info)
    cls = _BY_BASE.get(type(base), CollectiveError)
    rank = local_rank if rank < 0 else rank
    category, value, name, _, scope = info
    blame = "" if rank is None else f" (failing rank: {rank})"
    text = f"{message or info[3]}{blame} [{category}:{name or value}, {scope} scope]"
    if what and not text.startswith(what):
        text = f"{what}: {text}"
    return cls(text, code=base.code, category=base.category, scope=base.scope, rank=rank)


# -- arguments ---------------------------------------------------------------------------------

class _Tensor(NamedTuple):
    address: int
    nbytes: int
    ferry_dtype: int  # -1: none ferry knows (raw bytes)
    spec: TensorSpec
    keep: object

    @property
    def count(self):
        return self.nbytes // self.spec.itemsize if self.spec.itemsize else 0


def _tensor(x, what, *, writable):
    """x as a C-contiguous CPU buffer; TypeError / ValueError (nothing is sent) if it is not."""
    s = source(x, what)
    keep = (s.keep, target(x, what).keep) if writable else s.keep
    return _Tensor(s.address, s.nbytes, s.ferry_dtype, s.spec, keep)


def _dtype_text(t):
    if t.spec.kind == "torch":
        return f"torch.{t.spec.dtype}"
    return str(np.dtype(t.spec.dtype))


def _dtype_key(t):
    return ("ferry", t.ferry_dtype) if t.ferry_dtype >= 0 else (t.spec.kind, t.spec.dtype)


def _check_reducible(ferry_dtype, what, shown):
    if ferry_dtype not in _REDUCIBLE:
        raise TypeError(f"{what}: cannot reduce {shown}: the reductions take uint8, int8, int16, "
                        "int32, int64, float16, bfloat16, float32 and float64 in native byte "
                        "order")


def _op(op):
    try:
        return OPS.index(op)
    except ValueError:
        raise ValueError(f"op must be one of {', '.join(OPS)}; got {op!r}") from None


def _check_out(out, t, nbytes, what):
    o = _tensor(out, f"{what}: out", writable=True)
    if _dtype_key(o) != _dtype_key(t):
        raise TypeError(f"{what}: out is {_dtype_text(o)}, x is {_dtype_text(t)}: they must match")
    if o.nbytes != nbytes:
        raise ValueError(f"{what}: out has {o.nbytes} bytes, needs {nbytes} bytes "
                         f"({nbytes // max(t.spec.itemsize, 1)} elements of {_dtype_text(t)})")
    return o


def _check_apart(t, o, what):
    """ValueError when out's memory overlaps x's: ferry offers x to the other ranks while it
    writes into out."""
    if t.nbytes and o.nbytes and t.address < o.address + o.nbytes and \
            o.address < t.address + t.nbytes:
        raise ValueError(f"{what}: out overlaps x: ferry reads x while it writes out (pass a "
                         f"copy of one of them)")


def _empty(t, shape, x):
    """A new tensor of x's kind and dtype (numpy or torch) of `shape`."""
    if t.spec.kind == "torch":
        return _torch_module().empty(shape, dtype=x.dtype)
    return np.empty(shape, dtype=np.dtype(t.spec.dtype))


def _size(value, what, minimum=0):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def _native_context(context, what):
    if not isinstance(context, Context):
        raise TypeError(f"{what}: expected a ferry.Context, got {type(context).__name__}")
    return context._native


def _addresses(addresses, what):
    if isinstance(addresses, str) or not all(isinstance(a, str) for a in addresses):
        raise TypeError(f"{what}: expected a list of 'host:port' strings")
    addresses = list(addresses)
    if not addresses:
        raise ValueError(f"{what}: no addresses")
    return addresses


# -- the imperative form -----------------------------------------------------------------------

class _Closing:
    """Context-manager use of an object with close()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Group(_Closing):
    """N processes (ranks) running collectives (ferry::collective::Group).

    Made by ``Group.join``. Every rank calls the same collectives in the same order, with
    tensors of the same size (and dtype) everywhere; each call blocks (the GIL released) until
    this rank's part is done, never longer than ``timeout``. Calls take numpy arrays and torch
    CPU tensors (and other C-contiguous buffers); bad input raises TypeError / ValueError on
    the calling rank before anything is sent, so the group stays usable. A failed call raises
    ``CollectiveError`` naming the failing rank (``.rank``); a failed group stays failed (every
    later call raises). One call at a time: calls from several threads run one after another.

    Use it as a context manager or call ``close()``. While a ``Service`` serves the group, its
    calls raise RuntimeError.
    """

    def __init__(self, native, context, addresses, name):
        """Not for users: see Group.join."""
        self._native = native
        self._context = context  # the group runs on it (the native side keeps it alive too)
        self._addresses = tuple(addresses)
        self._name = name
        _open.add(self)

    @classmethod
    def join(cls, context: Context, addresses, rank: int, *, name: str = "group",
             timeout: float = 60.0, join_timeout: float = 30.0,
             doubling_threshold: int = 128 << 10, ring_threshold: int = 128 << 20,
             segment_bytes: int = 512 << 10, busy_wait: bool = True,
             busy_wait_below: Optional[int] = None, busy_spin: float = 200e-6,
             busy_linger: float = 2e-3) -> "Group":
        """Joins group ``name`` as rank ``rank`` of ``len(addresses)``; returns the Group.

        ``context`` must listen at ``addresses[rank]``; ``addresses[r]`` is rank r's listen
        address ("host:port"), the same list on every rank. Connects to every other rank
        (retrying while they start) and returns once all have joined. Blocks (GIL released)
        up to ``join_timeout`` seconds, then raises ``CollectiveTimeoutError`` naming the ranks
        that did not join (``.rank``: the first of them).

        The keywords are ferry::collective::GroupOptions, with its defaults: ``timeout``
        (seconds, each call), ``join_timeout`` (seconds), ``doubling_threshold``,
        ``ring_threshold``, ``segment_bytes`` (bytes: where allreduce switches algorithm and
        the ring's pipeline unit), ``busy_wait`` (poll during small calls), ``busy_wait_below``
        (bytes; None: ferry picks from the cores and the ranks on this host), ``busy_spin``,
        ``busy_linger`` (seconds). docs/collectives.md explains each.
        """
        native_ctx = _native_context(context, "Group.join")
        addresses = _addresses(addresses, "Group.join: addresses")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < len(addresses):
            raise ValueError(f"Group.join: rank must be an int in [0, {len(addresses)}), "
                             f"got {rank!r}")
        if not context.address:
            raise ValueError("Group.join: the context must listen (at addresses[rank])")
        for what, seconds in (("timeout", timeout), ("join_timeout", join_timeout)):
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
                raise ValueError(f"Group.join: {what} must be a number of seconds > 0, "
                                 f"got {seconds!r}")
        options = {
            "name": str(name),
            "timeout_ms": _milliseconds(timeout, "timeout"),
            "join_timeout_ms": _milliseconds(join_timeout, "join_timeout"),
            "doubling_threshold": _size(doubling_threshold, "doubling_threshold"),
            "ring_threshold": _size(ring_threshold, "ring_threshold"),
            "segment_bytes": _size(segment_bytes, "segment_bytes", 1),
            "busy_wait": bool(busy_wait),
            "busy_spin_us": _seconds_to(busy_spin, "busy_spin", 1e6),
            "busy_linger_us": _seconds_to(busy_linger, "busy_linger", 1e6),
        }
        if busy_wait_below is not None:
            options["busy_wait_below"] = _size(busy_wait_below, "busy_wait_below")
        native, status = _native.Group.join(native_ctx, addresses, rank, options)
        if status is not None:
            raise _status_error(status, f"group {name!r}", rank)
        return cls(native, context, addresses, str(name))

    # -- what it is ----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def size(self) -> int:
        return self._native.size

    @property
    def addresses(self):
        return self._addresses

    @property
    def name(self) -> str:
        return self._name

    @property
    def context(self) -> Context:
        return self._context

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def refetches(self) -> int:
        """Fetches ferry started again after their data channel broke (Group::refetches)."""
        return self._native.refetches

    def chunk_range(self, count: int, rank: Optional[int] = None):
        """(first, last): the elements of ``count`` that ``rank`` (default: this one) gets
        from ``reduce_scatter``: ``[rank * count // size, (rank + 1) * count // size)``."""
        return _native.chunk_range(_size(count, "count"),
                                   self.rank if rank is None else rank, self.size)

    # -- collectives ---------------------------------------------------------------------------
    def allreduce(self, x, op: str = "sum"):
        """In place: x becomes ``op`` over every rank's x, element-wise; returns x.

        ``x``: a writable C-contiguous numpy array or torch CPU tensor of uint8, int8, int16,
        int32, int64, float16, bfloat16 (torch), float32 or float64; the same size and dtype on
        every rank. ``op``: "sum", "prod", "min" or "max" (integer sum and prod wrap).
        """
        t = _tensor(x, "allreduce: x", writable=True)
        _check_reducible(t.ferry_dtype, "allreduce", _dtype_text(t))
        self._check(self._group().allreduce(t.address, t.nbytes, t.ferry_dtype, _op(op)))
        return x

    def broadcast(self, x, root: int = 0):
        """In place: rank ``root``'s x is copied into every other rank's x; returns x.

        ``x``: a writable C-contiguous buffer (any dtype) of the same byte size on every rank.
        """
        t = _tensor(x, "broadcast: x", writable=True)
        self._check(self._group().broadcast(t.address, t.nbytes, self._root(root)))
        return x

    def allgather(self, x, out=None):
        """Every rank's x, in rank order: returns ``out``, of shape ``(size, *x.shape)``.

        ``x``: C-contiguous (read-only is fine), the same size on every rank. ``out``: None
        (a new numpy array / torch tensor like x), or a writable C-contiguous buffer of x's
        dtype and ``size * x.nbytes`` bytes (any shape), apart from x (ValueError otherwise).
        """
        t = _tensor(x, "allgather: x", writable=False)
        if out is None:
            out = _empty(t, (self.size, *t.spec.shape), x)
        o = _check_out(out, t, self.size * t.nbytes, "allgather")
        _check_apart(t, o, "allgather")
        self._check(self._group().allgather(t.address, t.nbytes, o.address, o.nbytes))
        return out

    def reduce_scatter(self, x, out=None, op: str = "sum"):
        """This rank's chunk of ``op`` over every rank's x: returns ``out``.

        x is taken flat (``count`` elements): this rank gets the reduced elements
        ``chunk_range(count)``, i.e. ``[rank * count // size, (rank + 1) * count // size)``,
        so any count works (chunks differ by at most one element). ``out``: None (a new 1-D
        numpy array / torch tensor of x's dtype with that many elements) or a writable
        C-contiguous buffer of x's dtype and exactly that many elements (any shape), apart
        from x (ValueError otherwise). ``x``:
        C-contiguous (read-only is fine), the same size and dtype on every rank; dtypes and
        ops as in ``allreduce``.
        """
        t = _tensor(x, "reduce_scatter: x", writable=False)
        _check_reducible(t.ferry_dtype, "reduce_scatter", _dtype_text(t))
        o = _op(op)
        first, last = self.chunk_range(t.count)
        if out is None:
            out = _empty(t, (last - first,), x)
        d = _check_out(out, t, (last - first) * t.spec.itemsize, "reduce_scatter")
        _check_apart(t, d, "reduce_scatter")
        self._check(self._group().reduce_scatter(t.address, t.nbytes, d.address, d.nbytes,
                                                 t.ferry_dtype, o))
        return out

    # -- lifetime ------------------------------------------------------------------------------
    def close(self):
        """Leaves the group (idempotent; blocks briefly, GIL released, while ferry lets it go).
        A call in progress on another thread, or a Service still serving the group, keeps it
        until it ends; calls made after close() raise ValueError."""
        self._native.close()
        _open.discard(self)

    def __repr__(self):
        state = "closed" if self.closed else f"rank {self.rank} of {self.size}"
        return f"<ferry.collective.Group {self._name!r} {state}>"

    def _group(self):
        if self._native.closed:
            raise ValueError("the collective group is closed")
        return self._native

    def _root(self, root):
        if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < self.size:
            raise ValueError(f"root must be a rank in [0, {self.size}), got {root!r}")
        return root

    def _check(self, status):
        """Raises the CollectiveError for a failed call's status (its message names the call)."""
        if status is not None:
            raise _status_error(status, f"group {self._name!r}", self.rank)


# -- the declarative form ----------------------------------------------------------------------

class Service(_Closing):
    """Serves a driver's collectives on this rank (ferry::collective::Service).

    ``Service(context, group, driver_address, name="default")``: runs, on a thread of its own
    (no Python), the commands of the ``Driver`` listening at ``driver_address`` (it may start
    later: the Service retries), over ``group`` (joined on ``context``) and the objects in
    ``context``'s store; results stay in that store until the driver releases them. ``name``
    tells several drivers of the same ranks apart. While it runs, the group's own calls raise
    RuntimeError. ``stop()`` (or the context manager's exit) stops it after the command in
    progress (bounded by the group's timeout; GIL released) and drops the results it holds.
    """

    def __init__(self, context: Context, group: Group, driver_address: str,
                 name: str = "default"):
        native_ctx = _native_context(context, "Service")
        if not isinstance(group, Group):
            raise TypeError(f"Service: expected a ferry.collective.Group, got "
                            f"{type(group).__name__}")
        if not isinstance(driver_address, str) or not driver_address:
            raise TypeError("Service: driver_address must be a 'host:port' string")
        self._native = _native.Service(group._group(), native_ctx, driver_address, str(name))
        self._group = group
        self._context = context
        self.driver_address = driver_address
        self.name = str(name)
        _open.add(self)

    @property
    def group(self) -> Group:
        return self._group

    @property
    def stopped(self) -> bool:
        return self._native.stopped

    def stop(self):
        """Stops serving (idempotent); the group's own calls work again."""
        self._native.stop()
        _open.discard(self)

    close = stop  # _Closing's __exit__ stops it

    def __repr__(self):
        state = "stopped" if self.stopped else f"serving {self.driver_address}"
        return f"<ferry.collective.Service {self.name!r} {state}>"


class DoneFuture(concurrent.futures.Future):
    """A Submitted collective's outcome: a ``concurrent.futures.Future`` that is also awaitable.

    ``result(timeout)`` returns None once every rank has finished, or raises a
    ``CollectiveError`` for the first rank (in rank order) that reported a failure or no report
    in time (``.rank``: the rank that report blames, or the silent rank; docs/python.md).
    Done-callbacks run on the driver's waiter thread (one per Driver); they must not block long.
    """

    def __await__(self):
        return asyncio.wrap_future(self).__await__()


class Submitted:
    """A collective a Driver submitted.

    ``results``: one ``ferry.ObjectRef`` per rank (``results[r]`` in rank r's store), usable at
    once (a fetch waits on the rank until its result exists) and fetchable by anyone as any ref;
    each describes its tensor (kind, dtype, shape: see the Driver's calls). ``done``: a
    ``DoneFuture``. ``id``: the command's number. The results stay in the ranks' stores until
    ``Driver.release(submitted)``.
    """

    __slots__ = ("_native", "results", "done", "id", "kind")

    def __init__(self, native, results, kind):
        self._native = native
        self.results: List[ObjectRef] = results
        self.done = DoneFuture()
        self.done.set_running_or_notify_cancel()  # it cannot be cancelled
        self.id = native.id
        self.kind = kind

    def __repr__(self):
        state = "done" if self.done.done() else "running"
        return f"<ferry.collective.Submitted {self.kind} #{self.id} {state}>"


class Driver(_Closing):
    """Runs collectives over objects already in the ranks' stores (ferry::collective::Driver).

    Made by ``Driver.create``; the ranks run a ``Service`` each for it. Each call submits one
    command and returns a ``Submitted`` at once (it blocks, GIL released, only to offer the
    command): its ``results`` are refs, its ``done`` a future. Commands run in submission order
    on every rank. One thread at a time (calls from several threads run one after another).
    Use it as a context manager or call ``close()``.

    The refs: ``refs[r]`` is a one-tensor object in rank r's store (its owner must be
    ``rank_addresses[r]``), the same byte size on every rank. The dtype of a reduction comes
    from the refs' TensorSpec (every rank's must agree; bytes put as such are uint8), or from
    ``dtype=`` (a numpy / torch dtype or its name), which reads the objects' bytes as that
    dtype (for refs whose own dtype cannot be reduced, or bytes that hold another one); the
    results are then flat, of that dtype.
    """

    def __init__(self, native, context, ranks, name):
        """Not for users: see Driver.create."""
        self._native = native
        self._context = context
        self._ranks = tuple(ranks)
        self.name = name
        self._waiter = _Waiter(name)
        # A Driver dropped unclosed: its native side closes with it, the waiter once it has
        # resolved what is pending (the thread holds the waiter, not the Driver).
        weakref.finalize(self, self._waiter.close)
        _open.add(self)

    @classmethod
    def create(cls, context: Context, rank_addresses, name: str = "default",
               timeout: float = 60.0) -> "Driver":
        """A Driver for the ranks listening at ``rank_addresses`` (rank r's at [r]).

        ``context`` must listen: the Services fetch their commands from it. Connects to every
        rank, blocking (GIL released) up to ``timeout`` seconds, which also bounds how long
        ``done`` waits for each rank's report of each command. ``name`` matches the Services'
        (several drivers of the same ranks). ferry.ConnectionError / TimeoutError if a rank
        cannot be reached.
        """
        native_ctx = _native_context(context, "Driver.create")
        ranks = _addresses(rank_addresses, "Driver.create: rank_addresses")
        if len(ranks) > 64:
            raise ValueError("Driver.create: at most 64 ranks")
        if not context.address:
            raise ValueError("Driver.create: the context must listen (the services fetch "
                             "commands from it)")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise ValueError(f"Driver.create: timeout must be a number of seconds > 0, "
                             f"got {timeout!r}")
        native = _native.Driver(native_ctx, ranks, str(name), _milliseconds(timeout, "timeout"))
        return cls(native, context, ranks, str(name))

    @property
    def size(self) -> int:
        return len(self._ranks)

    @property
    def rank_addresses(self):
        return self._ranks

    @property
    def closed(self) -> bool:
        return self._native.closed

    # -- collectives ---------------------------------------------------------------------------
    def allreduce_refs(self, refs, op: str = "sum", *, dtype=None) -> Submitted:
        """``op`` over every rank's object; ``results[r]``: rank r's copy of the result, with
        the spec of rank r's input (or flat, of ``dtype``, when given)."""
        specs = self._specs(refs, "allreduce_refs")
        o = _op(op)
        code, spec_of = self._reduction(refs, specs, dtype, "allreduce_refs")
        native = self._submit(lambda n: n.allreduce(self._native_refs(refs), code, o))
        return self._submitted(native, [spec_of(r) for r in range(self.size)], "allreduce")

    def broadcast_refs(self, refs, root: int = 0) -> Submitted:
        """Rank ``root``'s object to every rank: ``results[r]`` has the root's spec. ``refs``: a
        list with one entry per rank, of which only ``refs[root]`` is used (the others may be
        None)."""
        if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < self.size:
            raise ValueError(f"broadcast_refs: root must be a rank in [0, {self.size}), "
                             f"got {root!r}")
        self._check_list(refs, "broadcast_refs")
        spec = self._spec(refs[root], root, "broadcast_refs")
        native = self._submit(lambda n: n.broadcast(self._native_refs(refs, only=root), root))
        return self._submitted(native, [spec] * self.size, "broadcast")

    def allgather_refs(self, refs) -> Submitted:
        """Every rank's object in rank order: ``results[r]`` has shape ``(size, *shape)`` (rank
        0's shape) and the inputs' dtype, which must agree."""
        specs = self._specs(refs, "allgather_refs")
        keys = {(s.kind, s.dtype) for s in specs}
        if len(keys) > 1:
            raise TypeError(f"allgather_refs: the refs' dtypes differ: {sorted(keys)}")
        s0 = specs[0]
        spec = TensorSpec(s0.kind, s0.dtype, (self.size, *s0.shape))
        native = self._submit(lambda n: n.allgather(self._native_refs(refs)))
        return self._submitted(native, [spec] * self.size, "allgather")

    def reduce_scatter_refs(self, refs, op: str = "sum", *, dtype=None) -> Submitted:
        """Rank r gets its chunk of ``op`` over every rank's object (flat: the elements
        ``[r * count // size, (r + 1) * count // size)``): ``results[r]`` is 1-D."""
        specs = self._specs(refs, "reduce_scatter_refs")
        o = _op(op)
        code, spec_of = self._reduction(refs, specs, dtype, "reduce_scatter_refs")
        native = self._submit(lambda n: n.reduce_scatter(self._native_refs(refs), code, o))
        count = refs[0].nbytes // _itemsize(code)
        out = []
        for r in range(self.size):
            first, last = _native.chunk_range(count, r, self.size)
            s = spec_of(0)
            out.append(TensorSpec(s.kind, s.dtype, (last - first,)))
        return self._submitted(native, out, "reduce_scatter")

    def release(self, submitted: Submitted):
        """Drops the results of ``submitted`` from the ranks' stores (asynchronously, in command
        order: fetches of them fail with ObjectNotFoundError once the ranks got to it)."""
        if not isinstance(submitted, Submitted):
            raise TypeError(f"release: expected a Submitted, got {type(submitted).__name__}")
        self._live().release(submitted._native)

    # -- lifetime ------------------------------------------------------------------------------
    def close(self):
        """Closes the driver (idempotent; GIL released). Submissions in flight still resolve
        their ``done`` (failed, where the ranks no longer find the command) within the timeout;
        results not released stay with the ranks until their Services stop."""
        self._native.close()
        self._waiter.close()
        _open.discard(self)

    def __repr__(self):
        state = "closed" if self.closed else f"{self.size} ranks"
        return f"<ferry.collective.Driver {self.name!r} {state}>"

    # -- internals -----------------------------------------------------------------------------
    def _live(self):
        if self._native.closed:
            raise ValueError("the collective driver is closed")
        return self._native

    def _submit(self, call):
        return call(self._live())

    def _check_list(self, refs, what):
        if not isinstance(refs, (list, tuple)):
            raise TypeError(f"{what}: expected a list of ferry.ObjectRef, one per rank")
        if len(refs) != self.size:
            raise ValueError(f"{what}: {len(refs)} refs for {self.size} ranks")

    def _spec(self, ref, r, what):
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"{what}: refs[{r}] is {type(ref).__name__}, not a ferry.ObjectRef")
        if len(ref.tensors) != 1:
            raise ValueError(f"{what}: refs[{r}] holds {len(ref.tensors)} tensors; the "
                             "collectives take objects of one tensor")
        if ref.owner != self._ranks[r]:
            raise ValueError(f"{what}: refs[{r}] is owned by {ref.owner or 'no listener'!r}, "
                             f"not by rank {r} ({self._ranks[r]})")
        return ref.tensors[0]

    def _specs(self, refs, what):
        self._check_list(refs, what)
        specs = [self._spec(ref, r, what) for r, ref in enumerate(refs)]
        sizes = {ref.nbytes for ref in refs}
        if len(sizes) > 1:
            raise ValueError(f"{what}: the objects differ in size ({sorted(sizes)} bytes): "
                             "every rank's must be the same")
        return specs

    def _reduction(self, refs, specs, dtype, what):
        """(ferry dtype, rank -> result spec) for a reduction over `refs`."""
        if dtype is not None:
            code, spec = _given_dtype(dtype, what)
            itemsize = _itemsize(code)
            if refs[0].nbytes % itemsize:
                raise ValueError(f"{what}: {refs[0].nbytes} bytes are not whole elements of "
                                 f"{_DTYPE_NAMES[code]}")
            flat = TensorSpec(spec.kind, spec.dtype, (refs[0].nbytes // itemsize,))
            return code, lambda r: flat
        codes = [_spec_code(s) for s in specs]
        if len(set(codes)) > 1:
            shown = sorted({f"{s.kind}:{s.dtype}" for s in specs})
            raise TypeError(f"{what}: the refs' dtypes differ ({', '.join(shown)})")
        _check_reducible(codes[0], what, f"{specs[0].kind}:{specs[0].dtype} (pass dtype= to "
                         "reduce raw bytes as a dtype)")
        return codes[0], lambda r: specs[r]

    def _native_refs(self, refs, only=None):
        return [ref._native if only is None or r == only else None for r, ref in enumerate(refs)]

    def _submitted(self, native, specs, kind):
        results = []
        for native_ref, spec in zip(native.results, specs):
            assert spec.nbytes == native_ref.nbytes, (spec, native_ref.nbytes)
            results.append(ObjectRef(native_ref, [spec], True))
        s = Submitted(native, results, kind)
        self._waiter.add(s)
        return s


class _Waiter:
    """A Driver's waiter thread: resolves each submission's ``done`` once its C++ future is
    ready, in submission order (the ranks' order too). It waits in C++ in slices, so that it is
    never in native code while the interpreter exits, and ends once closed with nothing left."""

    def __init__(self, name):
        self.name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending = []  # [Submitted]
        self._closing = False
        self._running = True  # under _lock: the thread has not decided to end
        self.thread = self._start()
        _waiters.add(self)

    def _start(self):
        thread = threading.Thread(target=self._run, daemon=True,
                                  name=f"ferry-collective-driver-{self.name}")
        thread.start()
        return thread

    def add(self, submitted):
        with self._lock:
            self._pending.append(submitted)
            self._wake.notify_all()
            if not self._running and not _stopping:
                # Closed meanwhile, with nothing left then, the thread has ended: a submission
                # that was under way as the driver closed still gets its done resolved.
                self._running = True
                self.thread = self._start()

    def close(self):
        with self._lock:
            self._closing = True
            self._wake.notify_all()

    def _run(self):
        while True:
            with self._lock:
                while not self._pending and not self._closing and not _stopping:
                    self._wake.wait(_WAIT_SLICE_MS / 1000)
                if not self._pending or _stopping:
                    self._running = False
                    return
                s = self._pending[0]
            while not s._native.wait(_WAIT_SLICE_MS):  # GIL released while it waits
                if _stopping:
                    with self._lock:
                        self._running = False
                    return
            with self._lock:
                self._pending.pop(0)
            status = s._native.status()
            try:
                if status is None:
                    s.done.set_result(None)
                else:
                    s.done.set_exception(_status_error(
                        status, f"{s.kind} (command {s.id}) of driver {self.name!r}"))
            except concurrent.futures.InvalidStateError:
                pass
            del s


def _spec_code(spec):
    """The ferry dtype of a TensorSpec, or -1."""
    if spec.kind == "torch":
        return _FERRY_DTYPES.get(spec.dtype, -1)
    d = np.dtype(spec.dtype)
    if not (d.isnative or d.itemsize == 1):
        return -1
    return _FERRY_DTYPES.get(d.name, -1)


def _given_dtype(dtype, what):
    """(ferry dtype, TensorSpec-like kind/dtype) for a dtype argument: a name ("float32",
    "bfloat16"), a numpy dtype or a torch dtype."""
    torch = _torch_module()
    if torch is not None and isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, str) and dtype in _FERRY_DTYPES:
        name = dtype
    else:
        try:
            d = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"{what}: dtype {dtype!r} is not a dtype") from None
        name = d.name if (d.isnative or d.itemsize == 1) else ""
    code = _FERRY_DTYPES.get(name, -1)
    _check_reducible(code, what, repr(dtype))
    if name == "bfloat16":
        return code, TensorSpec("torch", name, ())
    return code, TensorSpec("numpy", np.dtype(name).str, ())


def _itemsize(code):
    return np.dtype(_DTYPE_NAMES[code]).itemsize if code != _FERRY_DTYPES["bfloat16"] else 2


# -- exit --------------------------------------------------------------------------------------

_open = weakref.WeakSet()  # open Groups, Services and Drivers, closed at exit
_waiters = weakref.WeakSet()  # Drivers' waiters whose thread runs (it holds its waiter)
_stopping = False


def _shutdown():
    """At exit, before ferry closes the contexts (atexit runs this first: it was registered
    later): services stop, drivers and groups close, waiter threads leave native code."""
    global _stopping
    _stopping = True
    items = list(_open)
    for kind in (Service, Driver, Group):
        for item in items:
            if isinstance(item, kind):
                try:
                    item.close()
                except Exception:  # noqa: BLE001 (exit goes on)
                    pass
    for waiter in list(_waiters):  # out of native code before the interpreter stops threads
        if waiter.thread is not threading.current_thread():
            waiter.thread.join(2 * _WAIT_SLICE_MS / 1000)


atexit.register(_shutdown)

__all__ = ["CollectiveError", "DoneFuture", "Driver", "Group", "OPS", "Service", "Submitted"]
