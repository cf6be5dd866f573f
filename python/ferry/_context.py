"""ferry.Context and ferry.Peer."""

import threading
from typing import NamedTuple, Optional

import numpy as np

from . import _completion, _ferry
from ._future import Future
from ._native import forwarded
from ._ref import ObjectRef
from ._tensors import source, target

# Context options that are durations: seconds here, milliseconds in ContextOptions.
_DURATIONS = ("connect_timeout", "handshake_timeout", "heartbeat_interval", "peer_timeout",
              "lease_timeout", "pool_idle_trim")


def _control_timeout(seconds):
    return _milliseconds(seconds, "timeout", none=_FOREVER_MS)


def _seconds_to(seconds, what, unit):
    """`seconds` (a number >= 0, not a bool) in `unit`s per second, rounded."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
        raise ValueError(f"{what} must be a number of seconds >= 0, got {seconds!r}")
    return int(round(seconds * unit))


class TlsOptions(NamedTuple):
    """TLS for the metadata channel (ferry::TlsOptions): paths of PEM files."""

    certificate: str = ""  # the chain this side presents (needed to accept TLS connections)
    private_key: str = ""  # its key
    ca: str = ""  # CAs the peer's certificate must chain to (needed to connect)


# What a blocking call's timeout=None stands for (ferry's control requests need a deadline).
_FOREVER_MS = 30 * 24 * 3600 * 1000
_LONGEST_MS = 100 * 365 * 24 * 3600 * 1000  # a timeout this long (or longer) means "never"


def _milliseconds(seconds, what, *, none=0):
    if seconds is None:
        return none
    if not isinstance(seconds, (int, float)) or not seconds >= 0:  # NaN too
        raise ValueError(f"{what} must be a number of seconds >= 0, got {seconds!r}")
    if seconds * 1000 >= _LONGEST_MS:  # inf included: past what the clocks hold
        return _LONGEST_MS
    ms = int(round(seconds * 1000))
    return max(ms, 1) if seconds > 0 else ms


class Context:
    """A ferry context: io threads, the local store, the transports, a listener, the peers.

    ``Context(listen="127.0.0.1:0")`` listens, so refs of what it puts name it as their owner
    (``ctx.address``); without ``listen`` it can only fetch (or call ``listen()`` later).
    Options left as None keep ferry's defaults (some read from the environment:
    ``$FERRY_TRANSPORT``, ``$FERRY_SECRET``, ``$FERRY_TLS_*``, ...); durations are in seconds.
    See ferry::ContextOptions (ferry/net/context.h) for each; ``tcp_chunk_bytes`` and
    ``tcp_congestion`` set the TCP transport's options (ferry::tcp::TcpOptions, ``chunk_bytes``
    and ``congestion``), ``busy_poll``, ``rdma_grants``, ``rdma_max_registration`` and
    ``rdma_fork_protection`` the RDMA transport's (ferry::rdma::RdmaOptions, ``busy_poll``,
    ``grants``, ``max_registration``: the most bytes one memory registration covers, larger
    memory registered in chunks of it, None: the device's own limit, 256 MiB on soft-RoCE; and
    ``fork_protection``: True turns libibverbs' fork protection on where the kernel does not
    copy pinned pages at fork, None: ``$FERRY_RDMA_FORK_PROTECTION``), ``cma_preferred`` and
    ``cma_copy_threads`` the same-host CMA transport's (ferry::cma::CmaOptions, ``preferred``:
    "auto" picks CMA for peers on this host; ``copy_threads``).

    ``idle_spin`` (seconds, at most 0.01; None: ``$FERRY_IO_SPIN_US``, else 50 us where the
    process may run on 4 cores or more and 0 below): how long the io thread keeps polling after
    work before it sleeps, so that the next fetch issued (from a done-callback, say) or the next
    reply finds it awake instead of waking it (ferry::ContextOptions::idle_spin; one io thread
    only).

    ``wait_runs_loop`` (default True): a thread blocked in a fetch's ``result()`` /
    ``exception()`` (and ferry.rdt's ``wait_fetch_complete``) runs the context's event loop
    itself while it waits, and the io threads step aside, so a fetch's reply is read and its
    future resolved by the waiting thread with no other thread woken; ``wait_linger`` (seconds)
    keeps the io threads aside that much longer after such a wait, so that the next fetch of a
    loop starts without waking them (meanwhile nothing else runs the context). False: the wait
    sleeps until ferry's io thread hands it the outcome.

    Use it as a context manager or call ``close()``: closing stops listening, closes every peer
    (fetches in flight fail with a ferry error) and joins the io threads (bounded, 5 s). Every
    context still open is closed at interpreter exit.
    """

    def __init__(self, listen: Optional[str] = None, *, name: str = "ferry",
                 secret=None, tls=None, transport: Optional[str] = None, transports=None,
                 threads: int = 1, advertise: Optional[str] = None,
                 connect_timeout=None, handshake_timeout=None, heartbeat_interval=None,
                 peer_timeout=None, lease_timeout=None, pool_idle_trim=None,
                 max_frame_bytes=None, max_queued_control_bytes=None,
                 max_requests_per_peer=None, tcp_chunk_bytes=None, tcp_congestion=None,
                 busy_poll=None, rdma_grants=None, rdma_max_registration=None,
                 rdma_fork_protection=None, cma_preferred=None, cma_copy_threads=None,
                 pool_bytes=None, pool_populate_threads=None, idle_spin=None,
                 wait_runs_loop: bool = True, wait_linger: float = 500e-6):
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if not isinstance(wait_linger, (int, float)) or not 0 <= wait_linger <= 1:
            raise ValueError(f"wait_linger must be seconds in [0, 1], got {wait_linger!r}")
        if rdma_max_registration is not None and (
                not isinstance(rdma_max_registration, int) or isinstance(rdma_max_registration, bool)
                or not 0 <= rdma_max_registration < 1 << 64):
            raise ValueError("rdma_max_registration must be a byte count (an int >= 0), "
                             f"got {rdma_max_registration!r}")
        for flag, value in (("busy_poll", busy_poll), ("rdma_fork_protection", rdma_fork_protection),
                            ("cma_preferred", cma_preferred)):
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{flag} must be True, False or None, got {value!r}")
        options = {"name": str(name), "threads": threads, "wait_runs_loop": bool(wait_runs_loop),
                   "wait_linger_us": int(round(wait_linger * 1e6))}
        if idle_spin is not None:
            options["idle_spin_us"] = _seconds_to(idle_spin, "idle_spin", 1e6)
            if idle_spin > 0.01:
                raise ValueError(f"idle_spin must be at most 0.01 s, got {idle_spin!r}")
        given = dict(transport=transport, max_frame_bytes=max_frame_bytes,
                     max_queued_control_bytes=max_queued_control_bytes,
                     max_requests_per_peer=max_requests_per_peer,
                     tcp_chunk_bytes=tcp_chunk_bytes, tcp_congestion=tcp_congestion,
                     busy_poll=busy_poll, rdma_grants=rdma_grants,
                     rdma_max_registration=rdma_max_registration,
                     rdma_fork_protection=rdma_fork_protection, cma_preferred=cma_preferred,
                     cma_copy_threads=cma_copy_threads, pool_bytes=pool_bytes,
                     pool_populate_threads=pool_populate_threads)
        options.update({k: v for k, v in given.items() if v is not None})
        durations = dict(connect_timeout=connect_timeout, handshake_timeout=handshake_timeout,
                         heartbeat_interval=heartbeat_interval, peer_timeout=peer_timeout,
                         lease_timeout=lease_timeout, pool_idle_trim=pool_idle_trim)
        for key, seconds in durations.items():
            if seconds is not None:
                options[key] = _milliseconds(seconds, key)
        if transports is not None:
            options["transports"] = [str(t) for t in transports]
        if secret is not None:
            options["secret"] = secret.decode() if isinstance(secret, bytes) else str(secret)
        if tls is False:
            options["tls"] = ("", "", "")
        elif tls is not None:
            tls = TlsOptions(**tls) if isinstance(tls, dict) else TlsOptions(*tls)
            options["tls"] = tuple(str(p) for p in tls)
        self._native = _ferry.Context(options)
        self._lock = threading.Lock()
        _completion.register(self)
        if advertise is not None:
            self._native.set_advertise_address(str(advertise))
        if listen is not None:
            try:
                self.listen(listen)
            except BaseException:
                self.close()
                raise

    # -- lifetime ------------------------------------------------------------------------------
    def close(self):
        """Closes the context (idempotent; blocks up to ~5 s with the GIL released)."""
        self._native.close()

    @property
    def closed(self):
        return self._native.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else (self.address or "not listening")
        return f"<ferry.Context {state}>"

    # -- listening -----------------------------------------------------------------------------
    def listen(self, address: str = "127.0.0.1:0") -> int:
        """Listens for peers on "host:port" (port 0: any); returns the port."""
        return self._native.listen(str(address))

    @property
    def address(self) -> str:
        """The address refs name as their owner ("" when not listening)."""
        return self._native.address

    # -- the store -----------------------------------------------------------------------------
    def put(self, tensors, *, copy=False, transport=None, exclusive=False, name=None,
            checksum=False):
        """Puts one tensor, or a list/tuple of them, into the store; returns their ObjectRef.

        Each tensor is a numpy array, a torch CPU tensor or an object exporting a C-contiguous
        buffer (bytes, bytearray, memoryview, ...). Zero copy: the store references the
        tensor's memory and holds a reference to the object until the object is collected, so
        the caller may drop its own; the memory must not change until then. ``copy=True``
        copies the bytes into the store instead.

        The object lives until ``release(ref)`` and until no peer holds it and no fetch is
        serving it. A fetch of the ref returns one tensor if one was put on its own, else a
        list. ``transport``/``exclusive``: the transport preferred for it (only that one, when
        exclusive). ``name``: peers can also fetch it by that name (ferry::PutOptions::name).
        ``checksum=True``: computes each tensor's CRC-32C now (one pass over its bytes) and puts
        it in the ref; a fetch of the ref then checks what landed and fails with
        ferry.DataCorruptedError on a difference (bytes changed after the put, or a transport
        that delivered something else).
        """
        single = not isinstance(tensors, (list, tuple))
        items = [tensors] if single else list(tensors)
        if not items:
            raise ValueError("put: nothing to put (an empty list)")
        sources = [source(x, "put" if single else f"put[{i}]") for i, x in enumerate(items)]
        native = self._native.put(
            [(s.address, s.nbytes, s.ferry_dtype, list(s.spec.shape)) for s in sources],
            tuple(s.keep for s in sources), transport or "", bool(exclusive), bool(copy),
            name or "", bool(checksum))
        return ObjectRef(native, [s.spec for s in sources], single)

    def release(self, ref: ObjectRef) -> bool:
        """Drops the local reference put() gave; collection follows when no peer holds the
        object and no fetch serves it. False when this context holds no such object."""
        return self._native.release(_native_ref(ref))

    def abort_serving(self, ref: ObjectRef) -> bool:
        """Aborts every fetch of ``ref``'s object this context is serving now: each fetcher's
        future fails with ferry.AbortedError within about one round trip. Over TCP the sending
        stops at once; over RDMA the fetcher stops reading first, so the memory stays valid
        under its posted reads. Later fetches are served as usual: release(ref) first to refuse
        them. Never blocks. False when ``ref`` was not put by this context."""
        return self._native.abort_serving(_native_ref(ref))

    def refs(self):
        """Refs of every object in the store (as ferry describes them: no Python kinds)."""
        return [ObjectRef(r) for r in self._native.refs()]

    # -- peers ---------------------------------------------------------------------------------
    def connect(self, address) -> "Peer":
        """Connects to a peer: "host:port", or an ObjectRef (its owner). Blocks (GIL released)
        up to connect_timeout + handshake_timeout; ferry.ConnectionError when it fails."""
        if isinstance(address, ObjectRef):
            if not address.owner:
                raise ValueError("the ref names no owner (its context was not listening)")
            address = address.owner
        if not isinstance(address, str):
            raise TypeError(f"connect: expected 'host:port' or an ObjectRef, got {address!r}")
        return Peer(self, self._native.connect(address))

    # -- introspection -------------------------------------------------------------------------
    @property
    def transports(self):
        """Names of the transports this context uses, best first."""
        return self._native.transports()

    @property
    def peer_count(self):
        return self._native.peer_count()

    def pool_stats(self):
        """The receive pool's gauges and counters (ferry::PoolStats) as a dict."""
        return self._native.pool_stats()

    def stats(self):
        """What this context has done since it started (ferry::Stats, docs/metrics.md) as a
        dict: fetches and serves (succeeded, failed, errors by name, bytes, by transport),
        serves in flight, fetch latency count and sum, connections, peers, the pool, and
        ``transport_metrics``: each transport's own metrics by name (RDMA: registrations,
        registration time, live registrations, memory windows, queue pairs)."""
        return self._native.stats()

    def prometheus_text(self, labels=""):
        """stats() in Prometheus' text format (metrics named ferry_*), for an exporter of the
        application's own; ``labels`` (e.g. 'instance="a"') is added to every sample."""
        return self._native.prometheus_text(labels)

    @property
    def inflight(self):
        """Fetches started from this context that have not completed yet."""
        return self._native.inflight()


class Peer:
    """A connection to another process's Context (from ``Context.connect``).

    Closed by ``close()``, by its Context's close, or when the last reference to it goes (a
    fetch in flight holds one)."""

    def __init__(self, context, native):
        self._context = context  # a peer keeps its context open
        self._native = native

    address = forwarded("address")
    is_open = forwarded("is_open")
    transport = forwarded("transport",
                          doc='The transport negotiated with this peer ("TCP", "RDMA").')

    def fetch(self, ref: ObjectRef, into=None, *, timeout=None, transport=None,
              verify=True) -> Future:
        """Starts fetching ``ref``; returns a Future at once (it waits for nothing on the
        network; without ``into``, while other fetches run, taking the receive memory may first
        fault a new pool region in, with the GIL released).

        ``into``: where the tensors land: a writable buffer (numpy array, torch CPU tensor,
        bytearray, memoryview, ...) for a ref of one tensor, or a list with one per tensor, each
        exactly the tensor's size; ferry writes straight into them. The future's result is then
        ``into`` itself. Without ``into``, ferry allocates (from its receive pool) and the
        result is the tensors as put: numpy arrays / torch tensors of the original dtype and
        shape, viewing that memory (zero copy) and keeping it alive; one tensor for a ref made
        by ``put(tensor)``, else a list.

        ``timeout``: seconds for the fetch itself (ferry.TimeoutError after it); None: none
        (peer liveness still bounds a stall). ``transport``: force one ("TCP", "RDMA").
        ``verify``: when the ref carries checksums (``put(..., checksum=True)``), the bytes that
        landed are checked before the future completes (ferry.DataCorruptedError on a
        difference; ``into`` then holds what arrived); False skips the check. Wrong sizes, read-only or non-contiguous targets raise ValueError before anything
        starts.
        """
        if not isinstance(ref, ObjectRef):
            raise TypeError(f"fetch: expected a ferry.ObjectRef, got {type(ref).__name__}")
        timeout_ms = _milliseconds(timeout, "timeout")
        if type(into) is np.ndarray:  # the common case, checked in C++ (None: not this array)
            future = Future(self, ref, into, into)
            request = self._native.fetch_array(ref._native, into, timeout_ms, transport or "",
                                               bool(verify), future)
            if request is not None:
                future._request = request
                return future
        targets = []
        if into is not None:
            targets = _targets(ref, into)
        future = Future(self, ref, into, tuple(t.keep for t in targets))
        future._request = self._native.fetch(
            ref._native, [(t.address, t.nbytes) for t in targets], timeout_ms,
            transport or "", bool(verify), future)
        return future

    def hold(self, ref: ObjectRef, timeout=10.0):
        """Keeps the object alive on its owner until release() (or this connection ends).
        Blocks (GIL released) until the owner answers or ``timeout`` seconds (None: no limit)
        pass; ferry.TimeoutError then."""
        self._native.hold(_native_ref(ref), _control_timeout(timeout))

    def release(self, ref: ObjectRef, timeout=10.0):
        """Drops a hold()."""
        self._native.release(_native_ref(ref), _control_timeout(timeout))

    def list(self, timeout=10.0):
        """Refs of every object in the peer's store (as ferry describes them)."""
        return [ObjectRef(r) for r in self._native.list(_control_timeout(timeout))]

    def close(self):
        """Closes the connection; its fetches in flight fail with ferry.ConnectionError."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "open" if self.is_open else "closed"
        return f"<ferry.Peer {self.address} {state}>"


def _native_ref(ref):
    if not isinstance(ref, ObjectRef):
        raise TypeError(f"expected a ferry.ObjectRef, got {type(ref).__name__}")
    return ref._native


def _targets(ref, into):
    specs = ref.tensors
    if isinstance(into, (list, tuple)):
        buffers = list(into)
    elif len(specs) == 1:
        buffers = [into]
    else:
        raise TypeError(f"into: the ref holds {len(specs)} tensors: pass a list of buffers, "
                        "one per tensor")
    if len(buffers) != len(specs):
        raise ValueError(f"into: {len(buffers)} buffers for {len(specs)} tensors")
    targets = []
    for i, (buffer, spec) in enumerate(zip(buffers, specs)):
        what = "into" if len(specs) == 1 else f"into[{i}]"
        t = target(buffer, what)
        if t.nbytes != spec.nbytes:
            raise ValueError(f"{what}: {t.nbytes} bytes, but the tensor has {spec.nbytes} "
                             f"({spec.kind} {spec.dtype} {list(spec.shape)})")
        targets.append(t)
    return targets
