"""ferry.ObjectRef: a small, picklable handle to an object in some process's store."""

import json
import struct

from . import _ferry
from ._native import forwarded
from ._tensors import TensorSpec, spec_from_native

# bytes(ref): MAGIC, u32 length of the C++ ref, the C++ ref (ObjectRef::serialize), then the
# Python description as UTF-8 JSON. A protobuf ref never starts with MAGIC ('F' = field 8 with
# wire type 6, which does not exist), so from_bytes() also takes a bare C++ ref.
_MAGIC = b"FRY\x01"
_HEADER = struct.Struct("<4sI")


class ObjectRef:
    """A handle to an object in some process's store (ferry::ObjectRef plus, per tensor, what
    Python object it was: numpy or torch, its exact dtype and shape).

    Refs are small and travel freely: ``pickle``, ``bytes(ref)`` / ``ObjectRef.from_bytes(b)``,
    ``str(ref)`` / ``ObjectRef.from_string(s)`` (ferry's text form, which C++ and the ``ferry``
    tool read too; it does not carry the Python description, so a fetch of a ref made from text
    returns numpy arrays of ferry's dtypes, bfloat16 as torch). Holding a ref keeps nothing alive:
    the owner's object lives until its owner releases it (``Context.release``) and no peer holds
    it (``Peer.hold``).
    """

    __slots__ = ("_native", "_specs", "_single")

    def __init__(self, native, specs=None, single=False):
        """Not for users: refs come from Context.put, from_bytes, from_string and pickle."""
        if not isinstance(native, _ferry.CRef):
            raise TypeError("ObjectRef is made by Context.put(), from_bytes() or from_string()")
        if specs is None:
            specs = [spec_from_native(*t) for t in native.tensors]
            single = False
        self._native = native
        self._specs = tuple(specs)
        self._single = bool(single)

    # -- what it names -------------------------------------------------------------------------
    owner = forwarded(
        "owner",
        doc='``host:port`` of the owner\'s listener ("" when its context was not listening).')
    object_id = forwarded("object_id")
    owner_instance = forwarded("owner_instance")
    nbytes = forwarded("nbytes")

    @property
    def tensors(self):
        """One TensorSpec (kind, dtype, shape) per tensor."""
        return self._specs

    @property
    def single(self):
        """Whether one tensor was put on its own (a fetch then returns one tensor, not a list)."""
        return self._single

    # -- forms ---------------------------------------------------------------------------------
    def __bytes__(self):
        native = self._native.serialize()
        meta = json.dumps({"single": self._single, "tensors": [s.to_json() for s in self._specs]},
                          separators=(",", ":")).encode()
        return _HEADER.pack(_MAGIC, len(native)) + native + meta

    @classmethod
    def from_bytes(cls, data):
        """Inverse of bytes(ref); also takes ferry's C++ binary form. ValueError if malformed."""
        data = bytes(data)
        if not data.startswith(_MAGIC):
            return cls(_parse_native(data))
        if len(data) < _HEADER.size:
            raise ValueError("malformed ferry ObjectRef: truncated")
        _, length = _HEADER.unpack_from(data)
        native_bytes = data[_HEADER.size:_HEADER.size + length]
        if len(native_bytes) != length:
            raise ValueError("malformed ferry ObjectRef: truncated")
        native = _parse_native(native_bytes)
        try:
            meta = json.loads(data[_HEADER.size + length:].decode())
            specs = [TensorSpec.from_json(t) for t in meta["tensors"]]
            single = meta["single"]
            if not isinstance(single, bool):
                raise ValueError("single")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise ValueError(f"malformed ferry ObjectRef: bad tensor description ({e})") from None
        described = native.tensors
        if len(specs) != len(described) or (single and len(specs) != 1):
            raise ValueError("malformed ferry ObjectRef: tensor count does not match")
        for spec, (_, _, _, nbytes) in zip(specs, described):
            if spec.nbytes != nbytes:
                raise ValueError("malformed ferry ObjectRef: tensor sizes do not match")
        return cls(native, specs, single)

    def __str__(self):
        """ferry's text form ("ferry1:..."): what the C++ API and the ferry tool read."""
        return self._native.to_string()

    @classmethod
    def from_string(cls, text):
        try:
            return cls(_ferry.CRef.from_string(text))
        except ValueError as e:
            raise ValueError(f"not a ferry ObjectRef: {e}") from None

    def __reduce__(self):
        return (ObjectRef.from_bytes, (bytes(self),))

    def __eq__(self, other):
        if not isinstance(other, ObjectRef):
            return NotImplemented
        return bytes(self) == bytes(other)

    def __hash__(self):
        return hash((self.owner, self.object_id, self.owner_instance, self._native.name))

    def __repr__(self):
        kinds = ", ".join(f"{s.kind}:{s.dtype}{list(s.shape)}" for s in self._specs)
        return f"ObjectRef(owner={self.owner!r}, id={self.object_id}, [{kinds}])"


def _parse_native(data):
    try:
        return _ferry.CRef.parse(data)
    except ValueError as e:
        raise ValueError(f"malformed ferry ObjectRef: {e}") from None
