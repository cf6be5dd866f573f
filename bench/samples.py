"""Statistics over bench samples (samples.json), shared by run.py's report and markdown.py."""
import statistics

KIB, MIB = 1 << 10, 1 << 20
ALLREDUCE_PEERS = ["gloo", "mpi"]


def human(n):
    for unit, div in (("G", 1 << 30), ("M", MIB), ("K", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def stat(values):
    v = [x for x in values if isinstance(x, (int, float))]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def medians(samples, suite, metric, tool, key):
    out = {}
    for s in samples:
        if s.get("suite") == suite and s.get("metric") == metric and s.get("tool") == tool:
            out.setdefault(s["size"], []).append(s.get(key))
    return {size: stat(v) for size, v in out.items()}


def paired_ratios(samples, suite, metric, peer, key, size):
    """ferry / peer within each repetition (the two ran a few seconds apart): a drift of the
    machine between repetitions moves both."""
    by_rep = {}
    for s in samples:
        if (s.get("suite") == suite and s.get("metric") == metric and s.get("size") == size
                and s.get("tool") in ("ferry", peer) and isinstance(s.get(key), (int, float))):
            by_rep.setdefault(s.get("rep"), {})[s["tool"]] = s[key]
    return stat([r["ferry"] / r[peer] for r in by_rep.values()
                 if "ferry" in r and r.get(peer)])


def better_allreduce_peer(samples, size):
    """The allreduce peer with the higher median busbw at `size`, and ferry / it within each
    run (a stat, or None when no peer was measured)."""
    peers = [((medians(samples, "allreduce", "bw", t, "busbw_gbps").get(size) or
               {}).get("median", 0), t) for t in ALLREDUCE_PEERS]
    best_bw, best = max(peers)
    if not best_bw:
        return best, None
    return best, paired_ratios(samples, "allreduce", "bw", best, "busbw_gbps", size)


def grant_label(raw):
    """How a registration sample's owner granted RDMA reads (samples before --grants said
    memory_windows 0/1; their default on rxe was region rkeys)."""
    grants = raw.get("grants") or ("windows" if raw.get("memory_windows") else "regions")
    if grants == "auto":
        grants = "auto: registrations on rxe"
    return f"grants {grants}"


def by_ranks(samples):
    """[(ranks, samples)] for each rank count the allreduce suite ran at: every other suite's
    samples and that count's allreduce samples (samples from before --allreduce-ranks: 4)."""
    counts = sorted({s.get("ranks", 4) for s in samples if s.get("suite") == "allreduce"})
    return [(n, [s for s in samples if s.get("suite") != "allreduce" or
                 s.get("ranks", 4) == n]) for n in counts]
