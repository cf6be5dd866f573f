#!/usr/bin/env python3
"""The README's benchmark tables, in Markdown, from one run's samples.json.

    python3 bench/markdown.py [RESULTS_DIR]     (default: build/bench/results)

run.py writes RESULTS_DIR/tables.md with this after every run; the README's tables are pasted
from it, so each number there comes from the run named above them. Medians of the
repetitions; ratios are ferry / peer within each repetition, median [min-max] (samples.py).
"""
import json
import os
import sys

from samples import KIB, MIB, better_allreduce_peer, by_ranks, grant_label, medians, paired_ratios


def size_label(n):
    for unit, div in (("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def num(x):
    """Three significant digits; thousands separated from 1,000 up."""
    if x is None:
        return ""
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def med(samples, suite, metric, tool, key, size):
    s = medians(samples, suite, metric, tool, key).get(size)
    return s["median"] if s else None


def ratio(samples, suite, metric, peer, key, size):
    r = paired_ratios(samples, suite, metric, peer, key, size)
    if not r:
        return ""

    def two(x):
        return f"{x:.0f}" if x >= 100 else f"{x:.2g}"
    return f"{two(r['median'])} [{two(r['min'])}–{two(r['max'])}]"


def row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(names):
    return [row(names), row(["---"] * len(names))]


def tcp_bw(s):
    sizes = sorted(medians(s, "tcp", "bw", "ferry", "gbps"))
    out = header(["size", "ferry", "raw stream", "ferry / raw", "iperf3", "ferry / iperf3",
                  "ucx tag_bw", "ferry / tag_bw",
                  "ucx ucp_get", "ferry / ucp_get", "ferry fetches/s, 512 in flight",
                  "ferry CPU s/GB (both sides)"])
    for n in sizes:
        rate = med(s, "tcp", "rate", "ferry", "fetches_per_s", n)
        out.append(row([size_label(n), num(med(s, "tcp", "bw", "ferry", "gbps", n)),
                        num(med(s, "tcp", "bw", "raw-stream", "gbps", n)),
                        ratio(s, "tcp", "bw", "raw-stream", "gbps", n),
                        num(med(s, "tcp", "bw", "iperf3", "gbps", n)),
                        ratio(s, "tcp", "bw", "iperf3", "gbps", n),
                        num(med(s, "tcp", "bw", "ucx-tag_bw", "gbps", n)),
                        ratio(s, "tcp", "bw", "ucx-tag_bw", "gbps", n),
                        num(med(s, "tcp", "bw", "ucx-ucp_get", "gbps", n)),
                        ratio(s, "tcp", "bw", "ucx-ucp_get", "gbps", n),
                        num(rate), num(med(s, "tcp", "bw", "ferry", "cpu_s_per_gb", n))]))
    return out


def tcp_lat(s):
    sizes = sorted(medians(s, "tcp", "lat", "ferry", "p50_us"))
    out = header(["size", "ferry p50", "ferry p99", "raw ping-pong p50", "ferry / raw",
                  "sockperf p50", "ferry / sockperf", "qperf RTT", "ferry / qperf"])
    for n in sizes:
        out.append(row([size_label(n), num(med(s, "tcp", "lat", "ferry", "p50_us", n)),
                        num(med(s, "tcp", "lat", "ferry", "p99_us", n)),
                        num(med(s, "tcp", "lat", "raw-pingpong", "p50_us", n)),
                        ratio(s, "tcp", "lat", "raw-pingpong", "p50_us", n),
                        num(med(s, "tcp", "lat", "sockperf", "p50_us", n)),
                        ratio(s, "tcp", "lat", "sockperf", "p50_us", n),
                        num(med(s, "tcp", "lat", "qperf-rtt", "p50_us", n)),
                        ratio(s, "tcp", "lat", "qperf-rtt", "p50_us", n)]))
    return out


def rdma(s):
    sizes = sorted(set(medians(s, "rdma", "bw", "ferry", "gbps")) |
                   set(medians(s, "rdma", "lat", "ferry", "p50_us")))
    out = header(["size", "ferry GB/s", "ib_read_bw", "ferry / ib_read_bw", "ferry p50",
                  "ib_read_lat p50", "ferry / ib_read_lat", "ferry busy-poll",
                  "ferry, region grants", "ferry over TCP (same guest)",
                  "raw TCP ping-pong (same guest)"])
    for n in sizes:
        out.append(row([size_label(n), num(med(s, "rdma", "bw", "ferry", "gbps", n)),
                        num(med(s, "rdma", "bw", "ib_read_bw", "gbps", n)),
                        ratio(s, "rdma", "bw", "ib_read_bw", "gbps", n),
                        num(med(s, "rdma", "lat", "ferry", "p50_us", n)),
                        num(med(s, "rdma", "lat", "ib_read_lat", "p50_us", n)),
                        ratio(s, "rdma", "lat", "ib_read_lat", "p50_us", n),
                        num(med(s, "rdma", "lat", "ferry-busypoll", "p50_us", n)),
                        num(med(s, "rdma", "lat", "ferry-regions", "p50_us", n)),
                        num(med(s, "rdma", "lat", "ferry-tcp", "p50_us", n)),
                        num(med(s, "rdma", "lat", "raw-pingpong", "p50_us", n))]))
    return out


def registration(s):
    out = header(["case", "where", "put", "registration", "owner `ibv_reg_mr`",
                  "fetcher `ibv_reg_mr`", "fetch all (pass 2)", "reissued"])
    for x in s:
        if x.get("suite") != "registration":
            continue
        r = x["raw"]
        what = (f"{r['count']:,} × {size_label(r['bytes'])} "
                f"{'views of one allocation' if r['case'] == 'views' else 'separate tensors'}")
        rdma_run = r["transport"] == "RDMA"
        where = f"RDMA, guest ({grant_label(r)})" if rdma_run else "TCP, host"
        oc = r.get("owner_counters") or {}
        fc = r.get("fetcher_counters") or {}
        owner = f"{oc['registrations']:,}" if oc else ""
        if oc and oc.get("hits"):
            owner += f" ({oc['hits']:,} hits)"
        out.append(row([what, where, f"{r['put_s'] * 1e3:.1f} ms",
                        f"{r['registration_s'] * 1e3:.1f} ms" if rdma_run else
                        "(nothing to register)", owner,
                        f"{fc['registrations']:,}" if fc else "",
                        f"{r['pass2_s']:.2f} s ({r['pass2_gbps']:.2f} GB/s)",
                        r.get("reissued", "")]))
    return out


def scale(s):
    out = header(["peers", "in flight", "GB/s", "fetches/s", "p50 µs", "server RSS idle → busy"])
    for x in s:
        if x.get("suite") != "scale":
            continue
        r = x.get("raw", x)
        idle, busy = r.get("server_rss_idle"), r.get("server_rss_busy")
        rss = f"{idle / MIB:.1f} → {busy / MIB:.1f} MiB" if idle and busy else ""
        out.append(row([f"{x['peers']:,}", f"{x['inflight']:,}", f"{x['gbps']:.2f}",
                        f"{x['fetches_per_s']:,.0f}", f"{x['p50_us']:,.0f}", rss]))
    return out


def allreduce(s):
    sizes = sorted(medians(s, "allreduce", "bw", "ferry", "busbw_gbps"))
    out = header(["size", "ferry busbw", "Gloo busbw", "ferry / Gloo", "Open MPI busbw",
                  "ferry / MPI", "target: ≥ 1.0 × the better"])
    for n in sizes:
        target = ""
        if n >= MIB:
            best, r = better_allreduce_peer(s, n)
            if r:
                name = {"gloo": "Gloo", "mpi": "MPI"}[best]
                target = (f"{r['median']:.2f} ({name}): "
                          f"{'met' if r['median'] >= 1.0 else 'short'}")
        out.append(row([size_label(n), num(med(s, "allreduce", "bw", "ferry", "busbw_gbps", n)),
                        num(med(s, "allreduce", "bw", "gloo", "busbw_gbps", n)),
                        ratio(s, "allreduce", "bw", "gloo", "busbw_gbps", n),
                        num(med(s, "allreduce", "bw", "mpi", "busbw_gbps", n)),
                        ratio(s, "allreduce", "bw", "mpi", "busbw_gbps", n), target]))
    return out


def tables(samples, meta):
    parts = [f"<!-- from samples.json of `{meta.get('command', '?')}` at commit "
             f"`{meta.get('commit', '?')}`, started {meta.get('started', '?')} -->"]
    sections = [("TCP, loopback, bandwidth (GB/s)", tcp_bw),
                ("TCP, loopback, latency (µs)", tcp_lat),
                ("RDMA READ, soft-RoCE in the guest (latency µs)", rdma),
                ("Registration", registration), ("Scale", scale)]
    sections += [(f"Allreduce, {n} local ranks", lambda _, sub=sub: allreduce(sub))
                 for n, sub in by_ranks(samples)]
    for title, fn in sections:
        body = fn(samples)
        if len(body) > 2:
            parts += ["", f"**{title}**", ""] + body
    return "\n".join(parts) + "\n"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "bench", "results")
    saved = json.load(open(os.path.join(out_dir, "samples.json")))
    sys.stdout.write(tables(saved["samples"], saved["meta"]))


if __name__ == "__main__":
    main()
