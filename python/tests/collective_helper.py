"""A rank of the collective tests (test_collective.py), one process each.

    python collective_helper.py SCENARIO [--torch]

Every scenario starts a listening Context and prints its address; then reads one line,
base64(pickle({"addresses": [...], "rank": r, ...})), joins the group and runs the scenario:

    suite     every collective on several dtypes and paths, bad input on rank 0 first; prints
              base64(pickle({name: result})) and exits
    die       one warm-up allreduce; then rank `dead` exits (without a word) while the others
              call another allreduce; each survivor prints what it raised and how long it took
    service   runs a Service for the driver at `driver`, puts the objects of service_inputs()
              and prints base64(pickle({name: ref})); stops and exits at stdin EOF or "exit"

What the ranks put in, the test recomputes: inputs(), service_inputs().
"""

import os
import sys
import time

import numpy as np

from ferry_helper import decode, encode

COUNT_SMALL = 1001    # recursive doubling
COUNT_LARGE = 70001   # float32 > 128 KiB: recursive halving (power-of-two N) or the exchange
COUNT_RING = 5003     # through the ring, in segments, with the "ring" group's options
RING_OPTIONS = dict(name="ring", doubling_threshold=0, ring_threshold=4096, segment_bytes=1024,
                    busy_wait=False, busy_linger=0.0)


def inputs(rank, n):
    """What rank `rank` of `n` passes in the suite (deterministic)."""
    rng = np.random.default_rng(1000 + rank)
    return {
        "f32_small": rng.standard_normal(COUNT_SMALL).astype(np.float32),
        "f32_large": rng.standard_normal(COUNT_LARGE).astype(np.float32),
        "f32_ring": rng.standard_normal(COUNT_RING).astype(np.float32),
        "i32_max": rng.integers(-1 << 30, 1 << 30, size=(7, 11), dtype=np.int32),
        "u8_sum": rng.integers(0, 256, size=300, dtype=np.uint8),  # wraps
        "bf16_ints": rng.integers(-8, 9, size=257).astype(np.float32),  # exact in bfloat16
        "bcast": (rng.standard_normal((3, 4)) * (rank + 1)),
        "gather": np.arange(6, dtype=np.int64).reshape(2, 3) + 100 * rank,
        "rs_f64": rng.standard_normal(1003),
        "rs_i16": rng.integers(-100, 100, size=(5, 9), dtype=np.int16),
    }


def service_inputs(rank, n):
    """The objects rank `rank` puts for the declarative test."""
    rng = np.random.default_rng(2000 + rank)
    return {
        "sum": rng.standard_normal((4, 25)).astype(np.float32),
        "max": rng.integers(-1000, 1000, size=333, dtype=np.int32),
        "bcast": np.full((2, 5), float(rank + 1)),
        "gather": np.arange(4, dtype=np.int64) + 10 * rank,
        "rs": rng.standard_normal(1001),
        "raw": np.arange(64, dtype=np.float32).tobytes(),  # raw bytes: needs dtype=
    }


def _bad_inputs(group):
    """Bad calls on one rank: each must raise before anything is sent (the others make none
    of them, and the group must stay in step). Returns [(what, exception type, message)]."""
    out = []

    def expect(what, call):
        try:
            call()
        except (TypeError, ValueError) as e:
            out.append((what, type(e).__name__, str(e)))
        else:
            out.append((what, "no error", ""))

    f = np.arange(12, dtype=np.float32)
    ro = f.copy()
    ro.flags.writeable = False
    expect("non-contiguous", lambda: group.allreduce(f[::2]))
    expect("read-only", lambda: group.allreduce(ro))
    expect("bool", lambda: group.allreduce(np.zeros(4, dtype=bool)))
    expect("uint32", lambda: group.allreduce(np.zeros(4, dtype=np.uint32)))
    expect("byte-swapped", lambda: group.allreduce(np.zeros(4, dtype=">f4")))
    expect("bad op", lambda: group.allreduce(f, op="mean"))
    expect("bad root", lambda: group.broadcast(f, root=group.size))
    expect("broadcast read-only", lambda: group.broadcast(ro))
    expect("allgather out size",
           lambda: group.allgather(f, out=np.empty(12 * group.size + 1, dtype=np.float32)))
    expect("allgather out dtype",
           lambda: group.allgather(f, out=np.empty(12 * group.size, dtype=np.int32)))
    ro_out = np.empty(12 * group.size, dtype=np.float32)
    ro_out.flags.writeable = False
    expect("allgather out read-only", lambda: group.allgather(f, out=ro_out))
    expect("reduce_scatter out size",
           lambda: group.reduce_scatter(f, out=np.empty(100, dtype=np.float32)))
    expect("reduce_scatter out dtype",
           lambda: group.reduce_scatter(f, out=np.empty(12, dtype=np.float64)))
    expect("not a buffer", lambda: group.allreduce([1.0, 2.0]))
    gathered = np.empty(12 * group.size, dtype=np.float32)
    expect("allgather out overlaps x", lambda: group.allgather(gathered[:12], out=gathered))
    expect("reduce_scatter out overlaps x",
           lambda: group.reduce_scatter(f, out=f[:12 // group.size]))
    return out


def _suite(ctx, addresses, rank, with_torch):
    from ferry import collective

    n = len(addresses)
    x = inputs(rank, n)
    got = {}
    with collective.Group.join(ctx, addresses, rank, name="suite", timeout=30) as g:
        if rank == 0:
            got["bad"] = _bad_inputs(g)
        a = x["f32_small"]
        got["f32_small_returned_same"] = g.allreduce(a) is a
        got["f32_small"] = a
        got["f32_large"] = g.allreduce(x["f32_large"], op="sum")
        got["i32_max"] = g.allreduce(x["i32_max"], op="max")
        got["u8_sum"] = g.allreduce(x["u8_sum"])
        got["bcast"] = g.broadcast(x["bcast"], root=n - 1)
        got["gather"] = g.allgather(x["gather"])
        out = np.empty(n * 6, dtype=np.int64)
        got["gather_into_given"] = g.allgather(x["gather"], out=out) is out
        got["gather_given"] = out
        first, last = g.chunk_range(x["rs_f64"].size)
        got["rs_f64"] = g.reduce_scatter(x["rs_f64"])
        got["rs_range"] = (first, last)
        out16 = np.empty(g.chunk_range(45)[1] - g.chunk_range(45)[0], dtype=np.int16)
        got["rs_i16"] = g.reduce_scatter(x["rs_i16"], out=out16, op="min")
        if with_torch:
            import torch

            t = torch.from_numpy(x["bf16_ints"]).to(torch.bfloat16)
            g.allreduce(t)
            got["bf16_ints"] = t.view(torch.int16).numpy().copy()  # the bits
            tg = g.allgather(torch.full((2,), float(rank)))
            got["torch_gather"] = (type(tg).__name__, tuple(tg.shape), tg.numpy().copy())
        got["refetches"] = g.refetches
    with collective.Group.join(ctx, addresses, rank, timeout=30, **RING_OPTIONS) as ring:
        got["f32_ring"] = ring.allreduce(x["f32_ring"])
        got["rs_ring"] = ring.reduce_scatter(inputs(rank, n)["f32_ring"])
    return got


def _die(ctx, addresses, rank, dead, timeout):
    import ferry
    from ferry import collective

    g = collective.Group.join(ctx, addresses, rank, name="die", timeout=timeout)
    g.allreduce(np.ones(1000, dtype=np.float32))  # every rank in, once
    if rank == dead:
        time.sleep(0.3)  # the others are in their next call by now
        os._exit(3)
    data = np.ones(1 << 18, dtype=np.float32)  # 1 MiB
    t0 = time.monotonic()
    try:
        g.allreduce(data)
        outcome = {"raised": None}
    except ferry.FerryError as e:
        outcome = {"raised": type(e).__name__, "rank": getattr(e, "rank", "no attribute"),
                   "code": getattr(e.code, "name", e.code), "message": str(e),
                   "collective": isinstance(e, collective.CollectiveError)}
    outcome["took"] = time.monotonic() - t0
    try:  # a failed group stays failed
        g.allreduce(np.ones(4, dtype=np.float32))
        outcome["again"] = None
    except collective.CollectiveError as e:
        outcome["again"] = type(e).__name__
    return outcome


def _service(ctx, addresses, rank, driver):
    from ferry import collective

    with collective.Group.join(ctx, addresses, rank, name="served", timeout=3) as g:
        with collective.Service(ctx, g, driver, name="test") as service:
            try:
                g.allreduce(np.ones(3, dtype=np.float32))
                busy = "no error"
            except RuntimeError as e:
                busy = str(e)
            refs = {name: ctx.put(value) for name, value in service_inputs(rank, len(addresses))
                    .items()}
            gone = ctx.put(np.ones((4, 25), dtype=np.float32))
            ctx.release(gone)  # its id names nothing here any more
            refs["gone"] = gone
            sys.stdout.write(encode({"refs": refs, "busy": busy}))
            sys.stdout.flush()
            for line in sys.stdin:
                if line.strip() == "exit":
                    break
            service.stop()
            assert service.stopped


def main():
    import ferry

    scenario = sys.argv[1]
    with_torch = "--torch" in sys.argv
    host = os.environ.get("FERRY_TEST_HOST", "127.0.0.1")
    ctx = ferry.Context(f"{host}:0", name=f"collective-{scenario}")
    print(ctx.address, flush=True)
    args = decode(sys.stdin.readline())
    addresses, rank = args["addresses"], args["rank"]
    if scenario == "suite":
        sys.stdout.write(encode(_suite(ctx, addresses, rank, with_torch)))
    elif scenario == "die":
        sys.stdout.write(encode(_die(ctx, addresses, rank, args["dead"], args["timeout"])))
    elif scenario == "service":
        _service(ctx, addresses, rank, args["driver"])
    sys.stdout.flush()
    ctx.close()


if __name__ == "__main__":
    main()
