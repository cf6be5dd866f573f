"""ferry's errors as Python exceptions.

Every error ferry reports is a :class:`FerryError`. Where a built-in exception means the same,
the subclass derives from it too, so ``except TimeoutError`` and ``except ConnectionError`` catch
ferry's timeouts and broken connections.
"""

import builtins
import enum

from . import _ferry

#: ferry's error codes (``ferry::errc``), by name and value.
Errc = enum.IntEnum("Errc", _ferry._errc_values(), module=__name__)
Errc.__doc__ = "ferry's error codes (ferry::errc in ferry/net/errors.h)."


class FerryError(Exception):
    """An error ferry reported.

    Attributes:
        code: the error code: an :class:`Errc` for ferry's own errors, else the raw value (a
            system errno: see ``category``).
        category: ``"ferry"``, ``"system"``, ... (the std::error_category's name).
        scope: what broke: ``"operation"`` (retry it), ``"peer"`` (reconnect), ``"device"``,
            ``"context"`` (make a new Context), or ``"none"``.
        message: ferry's description of the code.
    """

    def __init__(self, message, *, code=None, category="ferry", scope="none"):
        super().__init__(message)
        self.code = code
        self.category = category
        self.scope = scope
        self.message = message

    def __reduce__(self):  # keeps code and scope across pickling (multiprocessing)
        return (_rebuild, (type(self), self.message, self.code, self.category, self.scope))


def _rebuild(cls, message, code, category, scope):
    return cls(message, code=code, category=category, scope=scope)


class TimeoutError(FerryError, builtins.TimeoutError):
    """The operation's own deadline passed (errc.timed_out)."""


class AbortedError(FerryError):
    """The operation was aborted (Future.abort() or cancel())."""


class ObjectNotFoundError(FerryError, LookupError):
    """The owner has no such object (released and collected, or never put there)."""


class StaleRefError(ObjectNotFoundError):
    """The ref comes from an earlier instance of its owner (the owner restarted)."""


class InvalidArgumentError(FerryError, ValueError):
    """ferry refused an argument (a size mismatch, a name already taken, ...)."""


class OverloadedError(FerryError):
    """The peer has too many of our requests in flight: retry later."""


class ResourceExhaustedError(FerryError, MemoryError):
    """The memory the request needs cannot be had."""


class DataCorruptedError(FerryError):
    """The fetched bytes differ from the checksum the owner put the object with
    (``put(..., checksum=True)``): the transfer corrupted them, or the owner changed the memory
    after the put. Fetching again may succeed."""


class ConnectionError(FerryError, builtins.ConnectionError):
    """Peer scope: the connection is gone or unusable (closed, refused, reset, unresponsive,
    handshake, authentication or TLS failure). Reconnect to go on."""


class AuthenticationError(ConnectionError):
    """The shared secret or TLS setup does not match the peer's."""


class TransportError(FerryError):
    """No transport by that name, or none usable with this peer."""


class DeviceError(FerryError):
    """A device (an RDMA NIC) failed."""


class ContextClosedError(FerryError):
    """The Context was closed."""


_BY_CODE = {
    "timed_out": TimeoutError,
    "aborted": AbortedError,
    "object_not_found": ObjectNotFoundError,
    "stale_ref": StaleRefError,
    "size_mismatch": InvalidArgumentError,
    "invalid_argument": InvalidArgumentError,
    "overloaded": OverloadedError,
    "resource_exhausted": ResourceExhaustedError,
    "data_corrupted": DataCorruptedError,
    "auth_failed": AuthenticationError,
    "tls_failed": AuthenticationError,
    "tls_required": AuthenticationError,
    "transport_unknown": TransportError,
    "transport_duplicate": TransportError,
    "transport_unavailable": TransportError,
    "device_error": DeviceError,
    "context_closed": ContextClosedError,
}
_BY_SCOPE = {"peer": ConnectionError, "device": DeviceError, "context": ContextClosedError}
# Every class from_info() makes besides FerryError itself, each once.
_SUBCLASSES = tuple(dict.fromkeys((*_BY_CODE.values(), *_BY_SCOPE.values())))


def from_info(info, what=""):
    """The exception for ``info`` = (category, value, errc name, message, scope)."""
    category, value, name, message, scope = info
    if category == "ferry" and name:
        code = Errc[name]
        cls = _BY_CODE.get(name) or _BY_SCOPE.get(scope, FerryError)
    else:
        code = value
        cls = _BY_SCOPE.get(scope, FerryError)
    text = f"{what}: {message}" if what else message
    text += f" [{category}:{name or value}, {scope} scope]"
    return cls(text, code=code, category=category, scope=scope)


_ferry._set_error_factory(from_info)
