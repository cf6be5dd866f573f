"""Python objects as ferry tensors and back, zero copy both ways.

put() accepts numpy arrays, torch CPU tensors and any object exporting a C-contiguous buffer
(bytes, bytearray, memoryview, array.array, mmap, ...). Each is described by a TensorSpec (what
it was: numpy or torch, the exact dtype, the shape), which travels inside ferry.ObjectRef so that
a fetch hands back the same kind of object.
"""

import functools
import math
import sys
from typing import NamedTuple, Tuple

import numpy as np

# ferry::DType values (ferry/store/tensor.h), for the C++ side's description of each tensor.
_FERRY_DTYPES = {
    "uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4,
    "float16": 5, "bfloat16": 6, "float32": 7, "float64": 8, "bool": 9,
}
# torch dtypes by name with their sizes, so refs can be checked without importing torch.
_TORCH_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "complex32": 4, "complex64": 8, "complex128": 16,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


class TensorSpec(NamedTuple):
    """What one tensor of an object was, so a fetch can make the same kind again."""

    kind: str  # "numpy" or "torch"
    dtype: str  # numpy: dtype.str ("<f4", "|b1"); torch: the dtype's name ("bfloat16")
    shape: Tuple[int, ...]

    @property
    def itemsize(self):
        if self.kind == "torch":
            size = _TORCH_ITEMSIZE.get(self.dtype)
            if size is None:
                import torch  # noqa: PLC0415 (a dtype newer than the table)

                size = torch.empty((), dtype=_torch_dtype(self.dtype)).element_size()
            return size
        return _numpy_itemsize(self.dtype)

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.itemsize

    def to_json(self):
        return [self.kind, self.dtype, list(self.shape)]

    @classmethod
    def from_json(cls, value):
        """Checks what a serialized ref says (it may come from anywhere): ValueError if wrong."""
        kind, dtype, shape = value
        if kind not in ("numpy", "torch") or not isinstance(dtype, str):
            raise ValueError(f"unknown tensor kind {kind!r}")
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"bad shape {shape!r}")
        if kind == "numpy":
            _numpy_dtype(dtype)
        elif dtype not in _TORCH_ITEMSIZE and not dtype.isidentifier():
            raise ValueError(f"bad torch dtype {dtype!r}")
        return cls(kind, dtype, tuple(shape))


class Source(NamedTuple):
    """One tensor to put: where its bytes are and what keeps them alive."""

    spec: TensorSpec
    address: int
    nbytes: int
    ferry_dtype: int  # ferry::DType, or -1: described to C++ peers as raw bytes
    keep: object


class Target(NamedTuple):
    """One buffer a fetch lands in."""

    address: int
    nbytes: int
    keep: object


def _torch_module():
    return sys.modules.get("torch")  # a torch tensor exists only if torch was imported


def _is_torch_tensor(x):
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtype(name):
    import torch  # noqa: PLC0415 (only when a ref holds torch tensors)

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"this torch has no dtype {name!r}")
    return dtype


@functools.lru_cache(maxsize=256)  # dtype strings come from refs: bounded
def _numpy_itemsize(text):
    return np.dtype(text).itemsize


def _numpy_dtype(text):
    dtype = np.dtype(text)
    if dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"dtype {text!r} is not a plain numeric dtype")
    return dtype


def _check_torch(t, what):
    if t.device.type != "cpu":
        raise ValueError(f"{what}: only CPU tensors are supported (this one is on {t.device})")
    if t.layout != _torch_module().strided or t.is_quantized:
        raise TypeError(f"{what}: only dense tensors are supported (layout {t.layout})")
    if not t.is_contiguous():
        raise ValueError(f"{what}: the tensor is not contiguous (call .contiguous() first)")
    if t.is_conj() or t.is_neg():
        raise ValueError(f"{what}: the tensor has a lazy conjugate/negative bit (resolve it first)")


def _buffer_array(x, what):
    """A numpy array viewing the buffer `x` exports (zero copy)."""
    try:
        view = memoryview(x)
    except TypeError:
        raise TypeError(
            f"{what}: expected a numpy array, a torch CPU tensor or an object exporting a buffer, "
            f"got {type(x).__name__}") from None
    if not view.c_contiguous:
        raise ValueError(f"{what}: the buffer is not C-contiguous")
    try:
        array = np.asarray(view)
        if array.dtype.hasobject or array.dtype.fields is not None:
            raise TypeError
    except (TypeError, ValueError):  # a format numpy does not know: its bytes then
        array = np.frombuffer(view, dtype=np.uint8)
    return array, view


def source(x, what="put"):
    """The Source for one tensor-like object; TypeError / ValueError when it cannot be put."""
    if _is_torch_tensor(x):
        _check_torch(x, what)
        name = str(x.dtype).removeprefix("torch.")
        spec = TensorSpec("torch", name, tuple(x.shape))
        return Source(spec, x.data_ptr(), x.numel() * x.element_size(),
                      _FERRY_DTYPES.get(name, -1), x)
    keep = x
    if not isinstance(x, np.ndarray):
        x, view = _buffer_array(x, what)
        keep = (keep, view, x)
    if x.dtype.hasobject or x.dtype.fields is not None:
        raise TypeError(f"{what}: dtype {x.dtype} holds no plain numbers (object or structured)")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: the array is not C-contiguous (np.ascontiguousarray() first)")
    spec = TensorSpec("numpy", x.dtype.str, tuple(x.shape))
    native = x.dtype.isnative or x.dtype.itemsize == 1
    ferry_dtype = _FERRY_DTYPES.get(x.dtype.name, -1) if native else -1
    return Source(spec, x.__array_interface__["data"][0], x.nbytes, ferry_dtype, keep)


def target(x, what="into"):
    """The Target for one writable buffer; TypeError / ValueError when ferry cannot land in it."""
    if _is_torch_tensor(x):
        _check_torch(x, what)
        return Target(x.data_ptr(), x.numel() * x.element_size(), x)
    keep = x
    if not isinstance(x, np.ndarray):
        try:
            if memoryview(x).readonly:
                raise ValueError(f"{what}: the buffer is read-only ({type(x).__name__})")
        except TypeError:
            pass  # _buffer_array says what is wrong
        x, view = _buffer_array(x, what)
        keep = (keep, view, x)
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: the array is not C-contiguous")
    if not x.flags.writeable:
        raise ValueError(f"{what}: the array is read-only")
    if x.dtype.hasobject:  # bytes landing on Python object pointers would crash the process
        raise TypeError(f"{what}: dtype {x.dtype} holds Python objects, not plain numbers")
    return Target(x.__array_interface__["data"][0], x.nbytes, keep)


def spec_from_native(shape, dtype, device, nbytes):
    """The TensorSpec for a tensor only ferry's C++ side described (a ref made by C++)."""
    kind = "torch" if dtype == "bfloat16" else "numpy"
    spec = TensorSpec(kind, dtype if kind == "torch" else np.dtype(dtype).str, tuple(shape))
    if spec.nbytes != nbytes:  # a raw byte buffer described by nbytes alone
        spec = TensorSpec("numpy", "|u1", (nbytes,))
    return spec


def materialize(spec, u8):
    """The tensor `spec` describes, viewing the uint8 array `u8` (zero copy)."""
    if spec.kind == "torch":
        import torch  # noqa: PLC0415

        dtype = _torch_dtype(spec.dtype)
        if u8.size == 0:
            return torch.empty(spec.shape, dtype=dtype)
        return torch.from_numpy(u8).view(dtype).reshape(spec.shape)
    dtype = _numpy_dtype(spec.dtype)
    if u8.size == 0:
        return np.empty(spec.shape, dtype=dtype)
    return u8.view(dtype).reshape(spec.shape)
