"""The other process of the two-process tests, and what both sides agree on.

    python ferry_helper.py own [--torch]  # puts the objects of objects(); prints one line:
                                          # base64(pickle({name: ref})) and its pid; then obeys
                                          # stdin lines ("release NAME", "exit"); exits at EOF
    python ferry_helper.py fetch          # reads one line, base64(pickle({name: ref})), fetches
                                          # each from its owner, checks it against objects(),
                                          # prints "ok N" or "FAIL ..." and exits 0 / 1
"""

import base64
import os
import pickle
import sys

import numpy as np


def objects(with_torch):
    """The objects both processes know by name (deterministic contents)."""
    rng = np.random.default_rng(1234)
    out = {
        "np_float32": rng.standard_normal((3, 5)).astype(np.float32),
        "np_int64": np.arange(-40, 40, dtype=np.int64).reshape(2, 4, 10),
        "np_float16": rng.standard_normal(17).astype(np.float16),
        "np_bool": rng.integers(0, 2, (4, 4)).astype(bool),
        "np_scalar": np.array(7.5, dtype=np.float64),
        "np_empty": np.zeros((0, 3), dtype=np.float32),
        "np_uint32": np.arange(9, dtype=np.uint32).reshape(3, 3),  # no ferry dtype: raw bytes
        "np_big": np.frombuffer(rng.bytes(8 << 20), dtype=np.uint8).reshape(1024, -1).copy(),
        "bytes": bytes(range(256)) * 4,
        "list": [np.arange(5, dtype=np.int32), np.ones((2, 2), dtype=np.float64)],
    }
    if with_torch:
        import torch

        g = torch.Generator().manual_seed(99)
        out.update({
            "t_float32": torch.randn(4, 6, generator=g),
            "t_bfloat16": torch.randn(3, 7, generator=g).to(torch.bfloat16),
            "t_float16": torch.randn(5, generator=g).to(torch.float16),
            "t_int8": torch.randint(-128, 127, (2, 3, 4), generator=g, dtype=torch.int8),
            "mixed": [torch.arange(6, dtype=torch.int64), np.full(3, 2.5, dtype=np.float32)],
        })
    return out


def expected_result(value):
    """What fetching `value` without targets returns: bytes come back as a uint8 array."""
    if isinstance(value, (bytes, bytearray)):
        return np.frombuffer(value, dtype=np.uint8)
    return value


def same(expected, got):
    """Raises AssertionError unless `got` is `expected`: same kind, dtype, shape and bytes."""
    if isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), f"{type(got)} {expected!r}"
        for e, g in zip(expected, got):
            same(e, g)
        return
    expected = expected_result(expected)
    if isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray), f"expected a numpy array, got {type(got)}"
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        assert got.shape == expected.shape, (got.shape, expected.shape)
        assert got.tobytes() == expected.tobytes(), "contents differ"
        return
    import torch

    assert isinstance(got, torch.Tensor), f"expected a torch tensor, got {type(got)}"
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    as_bytes = lambda t: t.contiguous().view(torch.uint8).numpy().tobytes()  # noqa: E731
    assert as_bytes(got) == as_bytes(expected), "contents differ"


def encode(obj):
    return base64.b64encode(pickle.dumps(obj)).decode() + "\n"


def decode(line):
    return pickle.loads(base64.b64decode(line))


def _own(with_torch):
    import ferry

    ctx = ferry.Context(os.environ.get("FERRY_TEST_HOST", "127.0.0.1") + ":0", name="helper-owner")
    refs = {name: ctx.put(value) for name, value in objects(with_torch).items()}
    sys.stdout.write(encode({"pid": os.getpid(), "refs": refs}))
    sys.stdout.flush()
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "release":
            ctx.release(refs[arg])
            print("released", flush=True)
        elif cmd == "exit":
            break
    ctx.close()


def _fetch():
    import ferry

    refs = decode(sys.stdin.readline())
    with_torch = any(s.kind == "torch" for r in refs.values() for s in r.tensors)
    want = objects(with_torch)
    with ferry.Context(name="helper-fetcher") as ctx:
        peer = ctx.connect(next(iter(refs.values())))
        futures = {name: peer.fetch(ref, timeout=30) for name, ref in refs.items()}
        for name, future in futures.items():
            try:
                same(want[name], future.result(timeout=60))
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
                return 1
    print(f"ok {len(refs)}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "own":
        _own("--torch" in sys.argv)
    elif sys.argv[1] == "fetch":
        sys.exit(_fetch())
