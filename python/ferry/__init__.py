"""ferry: asynchronous transfers of tensors and buffers between processes (TCP and RDMA).

    import ferry, numpy as np
    owner = ferry.Context(listen="127.0.0.1:0")
    ref = owner.put(np.arange(10.0))          # zero copy; the ref pickles
    # in another process:
    ctx = ferry.Context()
    peer = ctx.connect(ref)                   # the ref names its owner
    array = peer.fetch(ref).result(timeout=10)

See python/README.md for the threading and lifetime rules.
"""

from . import _ferry
from ._context import Context, Peer, TlsOptions
from ._errors import (
    AbortedError,
    AuthenticationError,
    ConnectionError,
    ContextClosedError,
    DataCorruptedError,
    DeviceError,
    Errc,
    FerryError,
    InvalidArgumentError,
    ObjectNotFoundError,
    OverloadedError,
    ResourceExhaustedError,
    StaleRefError,
    TimeoutError,
    TransportError,
)
from ._future import Future
from ._ref import ObjectRef
from ._tensors import TensorSpec
from . import collective  # last: it builds on the rest (and its exit hook runs before theirs)

__version__ = _ferry.__version__

__all__ = [
    "AbortedError", "AuthenticationError", "ConnectionError", "Context", "ContextClosedError",
    "DataCorruptedError", "DeviceError", "Errc", "FerryError", "Future", "InvalidArgumentError",
    "ObjectNotFoundError", "ObjectRef", "OverloadedError", "Peer", "ResourceExhaustedError",
    "StaleRefError", "TensorSpec", "TimeoutError", "TlsOptions", "TransportError", "collective",
]
