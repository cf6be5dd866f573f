#!/usr/bin/env python3
"""make bench: ferry beside the tools users trust, in one run, alternating, several repetitions.

Suites
  tcp           loopback: ferry-bench fetch vs iperf3 (and, from 1 MiB, iperf3 with 4
                parallel streams: what striping could reach, no target), ucx_perftest (tag_bw, ucp_get over TCP),
                qperf (tcp_bw, tcp_lat), sockperf ping-pong and a raw-socket fetch-shaped
                ping-pong (ferry-bench pingpong)
  receive       loopback: fetches into memory ferry allocates (its receive pool) vs into the
                caller's preallocated buffers, 64 KiB to 64 MiB, alternating
  rdma          inside the soft-RoCE guest (tests/softroce/ferry-vm): ferry over RDMA READ vs
                ib_read_bw / ib_read_lat on the same rxe devices
  registration  10,000 x 200 KiB views of one allocation and 1,000 x 2 MiB tensors, and the views
                fetched into ferry's receive pool (fetcher registrations counted) (in the guest,
                over RDMA; and on the host over TCP for comparison)
  scale         1, 16, 256, 1,024 peers on one server; 1 and 4,096 fetches in flight (TCP)
  misc          single-core memcpy (the loopback bound), idle CPU with a peer connected
  allreduce     4 local ranks over loopback TCP: ferry's Group::allreduce (ferry-bench allreduce)
                vs Gloo's ring allreduce (gloo-allreduce) and Open MPI's MPI_Allreduce over its
                TCP BTL (mpi-allreduce under mpirun); float32 sum; timed as NCCL's tests
                time them (calls back to back, the mean over ranks), algbw and busbw as they
                define them (busbw = algbw * 2(n-1)/n)
  python        loopback, two processes: ferry from Python (bench/python_bench.py, the ferry
                package from --python-path) into numpy buffers and into ferry's memory, beside
                ferry-bench fetch (C++) the same two ways and what a Python user has without
                ferry: pickle through multiprocessing.shared_memory (Ray's custom-transport
                example), torch.distributed send/recv over gloo, pickle over a TCP socket;
                bandwidth 4 KiB to 64 MiB, latency (1 in flight) at 4 and 64 KiB

Output (in --out): samples.json (every sample), report.txt (the table printed on stdout),
*.png (gnuplot), and rdma-samples.json from the guest. Only the standard library is used.
`--suites allreduce` runs that suite alone (on the host; the guest is started only for rdma,
registration and misc).
"""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time

import markdown
from loopback_cc import mixed, same_loopback_congestion, system_congestion
from samples import (ALLREDUCE_PEERS, KIB, MIB, better_allreduce_peer, by_ranks, grant_label,
                     human, medians, paired_ratios, stat)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FULL_TCP_SIZES = [8, 64, 512, 4 * KIB, 64 * KIB, 1 * MIB, 8 * MIB, 64 * MIB]
QUICK_TCP_SIZES = [8, 4 * KIB, 64 * KIB, 1 * MIB, 64 * MIB]
FULL_RDMA_SIZES = [8, 512, 4 * KIB, 64 * KIB, 1 * MIB, 8 * MIB, 64 * MIB]
QUICK_RDMA_SIZES = [8, 4 * KIB, 64 * KIB, 1 * MIB]
FULL_ALLREDUCE_SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB,
                        64 * MIB]
QUICK_ALLREDUCE_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB]
ALLREDUCE_RANKS = [4]  # --allreduce-ranks
FULL_PYTHON_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 8 * MIB, 64 * MIB]
QUICK_PYTHON_SIZES = [4 * KIB, 1 * MIB, 64 * MIB]
PYTHON_LAT_SIZES = (4 * KIB, 64 * KIB)  # the python suite's latency rows (1 in flight)
# bench/python_bench.py's tools: ferry into numpy buffers ("ferry", so paired_ratios gives
# ferry / peer), ferry into its own memory, and the peers.
PYTHON_PEERS = ["shm-pickle", "torch-gloo", "pickle-socket"]
# The C++ counterpart of a Python loop of fetch().result(): ferry-bench fetch --wait, a loop of
# fetch().wait(); a callback chain's counterpart is ferry-bench's completion-handler reissue.
WAIT_PEER = "ferry-cpp-wait"


def log(*a):
    print(*a, file=sys.stderr, flush=True)




class Proc:
    """A child process with a deadline; reaped with its rusage."""

    def __init__(self, argv, env=None, ready=False):
        self.argv = argv
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, env=e, text=True)
        self.address = None
        if ready:  # first stdout line: "ready HOST:PORT"
            line = self.p.stdout.readline()
            if not line.startswith("ready "):
                self.stop()
                raise RuntimeError(f"{argv[0]} did not start: {line!r} {self.p.stderr.read()}")
            self.address = line.split()[1]

    @property
    def pid(self):
        return self.p.pid

    def wait(self, timeout):
        """Waits (bounded); returns (rc, stdout, stderr, cpu seconds)."""
        try:
            out, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, err = self.p.communicate()
            return 124, out, err, 0.0
        return self.p.returncode, out, err, self.cpu()

    def cpu(self):
        # Popen reaps with waitpid; the children's rusage of this process grows by the child's.
        return getattr(self, "_cpu", 0.0)

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after `timeout`; returns the process's CPU seconds."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.communicate()
        return 0.0


def listening(port):
    """Whether some socket listens on TCP `port` (any address, IPv4 or IPv6)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            pass
    return False


def run_pair(server_argv, client_argv, timeout, env=None, server_ready=False, port=None):
    """Starts a server, runs a client to completion, stops the server. The server is ready when
    it prints "ready HOST:PORT" (server_ready) or listens on `port` (waited up to 30 s).
    Returns (client stdout, client stderr, CPU seconds of both processes)."""
    before = os.times()
    srv = Proc(server_argv, env=env, ready=server_ready)
    if port is not None:
        deadline = time.time() + 30
        while not listening(port) and srv.p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
    try:
        argv = [a.replace("{addr}", srv.address or "") for a in client_argv]
        argv = [a.replace("{pid}", str(srv.pid)) for a in argv]
        cli = Proc(argv, env=env)
        rc, out, err, _ = cli.wait(timeout)
    finally:
        srv.stop()
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system -
                                                          before.children_system)
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {rc}: {err.strip()[-800:]}")
    return out, err, cpu


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---------------------------------------------------------------- the tools, one sample each

class Bench:
    def __init__(self, args):
        self.args = args
        self.fb = os.path.abspath(args.ferry_bench)
        self.secs = args.seconds
        self.samples = []
        self.python_skipped = {}  # python suite: tool -> why it cannot run here

    def add(self, **s):
        self.samples.append(s)
        if self.args.inside_guest:  # what the guest measured survives a timeout
            self.save_guest_samples()
        keys = ("suite", "metric", "tool", "size", "gbps", "p50_us", "p99_us")
        log("  " + " ".join(f"{k}={s[k]:.4g}" if isinstance(s.get(k), float) else f"{k}={s.get(k)}"
                            for k in keys if k in s))

    def save_guest_samples(self):
        path = os.path.join(self.out_dir, "rdma-samples.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.samples, f, indent=1)
        os.replace(path + ".tmp", path)

    def guarded(self, what, fn):
        try:
            fn()
        except Exception as e:  # a peer tool failing must not sink the whole run
            log(f"  ! {what}: {e}")
            self.samples.append({"error": f"{what}: {e}"})
            if self.args.inside_guest:
                self.save_guest_samples()

    # ferry ---------------------------------------------------------------------------------
    def window(self, suite, size):
        """Seconds per sample: emulated rxe moves about 50 MB/s, so large objects get longer
        (4 objects' worth; ferry credits each fetch with the share of its span inside the
        window, so a window of a few objects is not quantized to whole fetches)."""
        return max(self.secs, 4 * size / 50e6) if suite == "rdma" else self.secs

    def ferry(self, suite, metric, size, rep, inflight, host="127.0.0.1", env=None,
              tool="ferry", extra=(), serve_extra=(), fetch_extra=()):
        secs = self.window(suite, size)
        srv = [self.fb, "serve", "--listen", f"{host}:0", "--sizes", str(size)] + list(extra)
        srv += list(serve_extra)
        cli = [self.fb, "fetch", "--from", "{addr}", "--size", str(size), "--inflight",
               str(inflight), "--seconds", str(secs), "--server-pid", "{pid}"] + list(extra)
        cli += list(fetch_extra)
        out, _, _ = run_pair(srv, cli, timeout=180 + 4 * secs, env=env, server_ready=True)
        r = json.loads(out.strip().splitlines()[-1])
        self.add(suite=suite, metric=metric, tool=tool, size=size, rep=rep, inflight=inflight,
                 gbps=r["gbps"], p50_us=r["p50_us"], p99_us=r["p99_us"],
                 fetches_per_s=r["fetches_per_s"], cpu_s_per_gb=r.get("cpu_s_per_gb"),
                 transport=r["transport"], raw=r)

    def python(self, metric, tool, size, rep, inflight):
        """One sample of bench/python_bench.py: tool "ferry" (ferry-py into numpy buffers),
        "ferry-py-alloc" (into ferry's memory), "ferry-cma" (into numpy buffers, both processes
        preferring the same-host CMA transport) or a peer. A tool that cannot run here (exit 77:
        ferry or torch.distributed's gloo missing) is recorded once as skipped, then left out."""
        if tool in self.python_skipped:
            return
        ours = ("ferry", "ferry-py-alloc", "ferry-wait", "ferry-cma")
        sub = "ferry-py" if tool in ours else tool
        # torch-gloo imports neither ferry nor the bundle's numpy: --torch-python may name
        # another interpreter (one that has torch), run without the ferry package's path.
        other = tool == "torch-gloo" and self.args.torch_python
        python = self.args.torch_python if other else self.args.python
        argv = [python, os.path.join(HERE, "python_bench.py"), sub, "--size",
                str(size), "--inflight", str(inflight), "--seconds", str(self.secs)]
        if tool in ("ferry", "ferry-wait", "ferry-cma"):
            argv.append("--into")
        if tool == "ferry-wait":
            argv.append("--wait")
        path = [] if other else [self.args.python_path]
        path += [x for x in [os.environ.get("PYTHONPATH")] if x]
        env = {"PYTHONPATH": os.pathsep.join(path)}
        if tool == "ferry-cma":
            env["FERRY_CMA_PREFERRED"] = "1"
            argv += ["--tool-name", "ferry-cma"]
        p = Proc(argv, env=env)
        # Bound: start-up (torch imports in a few seconds), the window, and the drain of the
        # slowest peer (64 MiB pickled: about a second a transfer on the 2-core VM, 4 queued).
        rc, out, err, _ = p.wait(180 + 4 * self.secs)
        last = (out.strip().splitlines() or ["{}"])[-1]
        if rc == 77:
            reason = json.loads(last).get("skipped", err.strip()[-300:])
            self.python_skipped[tool] = reason
            log(f"SKIPPED: python {tool}: {reason}")
            self.samples.append({"suite": "python", "tool": tool, "skipped": reason})
            return
        if rc != 0:
            what = "timed out" if rc == 124 else f"exited {rc}"
            raise RuntimeError(f"python_bench.py {sub} {what}: {err.strip()[-800:]}")
        r = json.loads(last)
        self.add(suite="python", metric=metric, tool=tool, size=size, rep=rep,
                 inflight=inflight, gbps=r["gbps"], p50_us=r["p50_us"], p99_us=r["p99_us"],
                 fetches_per_s=r["fetches_per_s"], cpu_s_per_gb=r.get("cpu_s_per_gb"), raw=r)

    def pingpong(self, size, rep, host="127.0.0.1", suite="tcp", inflight=1):
        """The raw-socket baseline (bench/pingpong.h): one request in flight is the latency
        peer (raw-pingpong); a window of `inflight` answers, each landing in a buffer of its own,
        is the bandwidth peer with ferry's working set (raw-stream)."""
        srv = [self.fb, "pingpong-serve", "--listen", f"{host}:0"]
        cli = [self.fb, "pingpong", "--to", "{addr}", "--size", str(size), "--seconds",
               str(self.secs), "--inflight", str(inflight)]
        out, _, _ = run_pair(srv, cli, timeout=60 + 4 * self.secs, server_ready=True)
        r = json.loads(out.strip().splitlines()[-1])
        self.add(suite=suite, metric="lat" if inflight == 1 else "bw",
                 tool="raw-pingpong" if inflight == 1 else "raw-stream", size=size, rep=rep,
                 inflight=inflight, gbps=r["gbps"], p50_us=r["p50_us"], p99_us=r["p99_us"],
                 fetches_per_s=r["fetches_per_s"], cpu_s_per_gb=None, raw=r)

    # iperf3 --------------------------------------------------------------------------------
    def iperf3(self, size, rep, streams=1):
        """iperf3 over loopback: one stream (tool iperf3, the streaming peer), or `streams`
        parallel ones (tool iperf3-P<streams>: what striping a transfer over several connections
        could reach on this machine; no target)."""
        port = free_port()
        srv = ["iperf3", "-s", "-1", "-p", str(port)]
        # iperf3 writes at most 1 MiB at a time; above that the stream is the same.
        cli = ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-l", str(min(size, MIB)), "-t",
               str(max(1, round(self.secs))), "-J"]
        if streams > 1:
            cli += ["-P", str(streams)]
        # The algorithm ferry's loopback data channels use (tcp::TcpOptions::congestion,
        # automatic: ferry/tcp/congestion.h), so that both stream under it.
        if system_congestion() != ONE_HOST_CONGESTION:
            cli += ["-C", ONE_HOST_CONGESTION]
        out, _, _ = run_pair(srv, cli, timeout=60 + 4 * self.secs, port=port)
        d = json.loads(out)
        end = d["end"]
        secs = end["sum_received"]["seconds"]
        gbps = end["sum_received"]["bytes"] / secs / 1e9
        cpu = end["cpu_utilization_percent"]
        cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100 * secs
        tool = "iperf3" if streams == 1 else f"iperf3-P{streams}"
        self.add(suite="tcp", metric="bw", tool=tool, size=size, rep=rep, gbps=gbps,
                 cpu_s_per_gb=cpu_s / (gbps * secs), raw={"cpu": cpu, "streams": streams})

    # ucx_perftest over TCP -------------------------------------------------------------------
    def ucx(self, test, size, rep):
        port = free_port()
        env = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}
        rate, most = (3e9, 200000) if test == "tag_bw" else (0.6e9, 5000)
        iters = int(max(20, min(most, rate * self.secs / max(size, 256))))
        srv = ["ucx_perftest", "-p", str(port)]
        cli = ["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s", str(size), "-n",
               str(iters), "-w", str(max(5, iters // 20))]
        out, _, cpu = run_pair(srv, cli, timeout=120 + 10 * self.secs, env=env, port=port)
        final = [l for l in out.splitlines() if l.startswith("Final:")]
        if not final:
            raise RuntimeError(f"ucx_perftest printed no Final line: {out[-400:]}")
        f = final[-1].split()
        # Final: iters  lat50  lat_avg  lat_overall  bw_avg  bw_overall  rate_avg  rate_overall
        gbps = float(f[6]) * MIB / 1e9  # UCX's MB is 2^20 bytes
        moved = size * iters
        self.add(suite="tcp", metric="bw", tool=f"ucx-{test}", size=size, rep=rep, gbps=gbps,
                 fetches_per_s=float(f[8]), cpu_s_per_gb=cpu / (moved / 1e9),
                 raw={"final": final[-1], "iters": iters})

    # qperf ---------------------------------------------------------------------------------
    def qperf(self, metric, size, rep):
        port = free_port()
        srv = ["qperf", "-lp", str(port)]
        test = "tcp_bw" if metric == "bw" else "tcp_lat"
        cli = ["qperf", "127.0.0.1", "-lp", str(port), "-m", str(size), "-t",
               str(max(1, round(self.secs))), "-v", "-un", test]
        out, _, _ = run_pair(srv, cli, timeout=60 + 4 * self.secs, port=port)
        vals = dict(re.findall(r"^\s+(\w+)\s+=\s+(.+?)\s*$", out, re.M))
        loc = float(vals["loc_cpus_used"].split()[0]) / 100
        rem = float(vals["rem_cpus_used"].split()[0]) / 100
        secs = float(vals["time"].split()[0])
        if metric == "bw":
            num, unit = vals["bw"].split()[:2]
            gbps = float(num) * {"GB/sec": 1, "MB/sec": 1e-3, "KB/sec": 1e-6}[unit]
            self.add(suite="tcp", metric="bw", tool="qperf", size=size, rep=rep, gbps=gbps,
                     cpu_s_per_gb=(loc + rem) * secs / (gbps * secs), raw=vals)
        else:
            num, unit = vals["latency"].split()[:2]
            one_way = float(num) * {"us": 1, "ms": 1e3, "sec": 1e6, "ns": 1e-3}[unit]
            # qperf reports half the round trip of a size-byte echo; a fetch is a round trip.
            self.add(suite="tcp", metric="lat", tool="qperf-rtt", size=size, rep=rep,
                     p50_us=2 * one_way, raw=vals)

    # sockperf ------------------------------------------------------------------------------
    def sockperf(self, size, rep):
        port = free_port()
        srv = ["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", str(port)]
        # sockperf's smallest message is 14 bytes (its header); 8 B runs as 14 B.
        cli = ["sockperf", "ping-pong", "--tcp", "-i", "127.0.0.1", "-p", str(port), "-m",
               str(max(14, size)),
               "-t", str(max(1, round(self.secs))), "--full-rtt"]
        out, err, _ = run_pair(srv, cli, timeout=60 + 4 * self.secs, port=port)
        text = out + err
        p50 = re.search(r"percentile 50\.000 =\s+([\d.]+)", text)
        p99 = re.search(r"percentile 99\.000 =\s+([\d.]+)", text)
        if not p50:
            raise RuntimeError(f"sockperf: no percentiles in {text[-400:]}")
        self.add(suite="tcp", metric="lat", tool="sockperf", size=size, rep=rep,
                 p50_us=float(p50.group(1)), p99_us=float(p99.group(1)) if p99 else None)

    # perftest (in the guest) -----------------------------------------------------------------
    def perftest(self, tool, size, rep):
        dev, peer_dev = os.environ["FERRY_RDMA_DEV"], os.environ["FERRY_RDMA_PEER_DEV"]
        server_ip = os.environ["FERRY_RDMA_PEER_IP"]
        port = str(free_port())
        common = ["-s", str(size), "-x", "1", "-F", "-p", port]
        if tool == "ib_read_bw":
            common += ["-D", str(max(1, round(self.window("rdma", size))))]
        else:  # bounded: a 64 MiB READ takes about a second on emulated rxe
            iters = max(5, min(self.args.lat_iters, int(50e6 * self.secs / size)))
            common += ["-n", str(iters)]
        srv = [tool, "-d", peer_dev] + common
        cli = [tool, "-d", dev] + common + [server_ip]
        out, _, cpu = run_pair(srv, cli, timeout=180 + 10 * self.window("rdma", size),
                               port=int(port))
        rows = [l.split() for l in out.splitlines()
                if re.match(r"^\s*\d+\s+\d+\s+[\d.]", l)]
        if not rows:
            raise RuntimeError(f"{tool}: no result row in {out[-600:]}")
        row = rows[-1]
        if tool == "ib_read_bw":
            # #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]
            gbps = float(row[3]) * 1e6 / 1e9  # perftest's MB/sec is 10^6 bytes
            self.add(suite="rdma", metric="bw", tool="ib_read_bw", size=size, rep=rep,
                     gbps=gbps, fetches_per_s=float(row[4]) * 1e6, raw=row)
        else:
            # #bytes #iter t_min t_max t_typical t_avg t_stdev 99% 99.9%
            self.add(suite="rdma", metric="lat", tool="ib_read_lat", size=size, rep=rep,
                     p50_us=float(row[4]), p99_us=float(row[7]), raw=row)


# ---------------------------------------------------------------- suites

def rotate(items, rep):
    """Alternation: each repetition starts with a different tool."""
    k = rep % len(items)
    return items[k:] + items[:k]


def bw_inflight(size):
    """16 in flight for small objects; 4 from 1 MiB up (enough to keep the stream full, and the
    landing buffers stay near the cache size, as iperf3's single 1 MiB buffer does)."""
    return max(4, min(16, (4 * MIB) // size))


# The TCP suite's peers and the program each needs: one not installed is SKIPPED, once.
TCP_PEER_PROGRAMS = {"iperf3": "iperf3", "iperf3 4 streams": "iperf3",
                     "ucx tag_bw": "ucx_perftest", "ucx ucp_get": "ucx_perftest",
                     "qperf tcp_bw": "qperf", "qperf tcp_lat": "qperf", "sockperf": "sockperf"}


def suite_tcp(b, sizes, reps, deadline=None):
    missing = sorted({what for what, prog in TCP_PEER_PROGRAMS.items() if not shutil.which(prog)})
    for what in missing:
        log(f"SKIPPED: tcp {what}: {TCP_PEER_PROGRAMS[what]} not found")
        b.samples.append({"suite": "tcp", "tool": what, "skipped":
                          f"{TCP_PEER_PROGRAMS[what]} not found"})
    for rep in range(reps):
        if rep > 0 and deadline and time.time() > deadline:
            log(f"tcp: time budget reached after {rep} of {reps} repetitions")
            b.samples.append({"suite": "tcp", "budget_reps": rep})
            break
        for size in sizes:
            log(f"tcp size {human(size)} rep {rep + 1}/{reps}")
            bw = [("ferry", lambda: b.ferry("tcp", "bw", size, rep, bw_inflight(size))),
                  ("raw stream", lambda: b.pingpong(size, rep, inflight=bw_inflight(size))),
                  ("iperf3", lambda: b.iperf3(size, rep)),
                  ("ucx tag_bw", lambda: b.ucx("tag_bw", size, rep)),
                  ("ucx ucp_get", lambda: b.ucx("ucp_get", size, rep)),
                  ("qperf tcp_bw", lambda: b.qperf("bw", size, rep))]
            lat = [("ferry lat", lambda: b.ferry("tcp", "lat", size, rep, 1)),
                   ("raw pingpong", lambda: b.pingpong(size, rep)),
                   ("qperf tcp_lat", lambda: b.qperf("lat", size, rep))]
            if size <= 60000:  # sockperf's largest message
                lat.append(("sockperf", lambda: b.sockperf(size, rep)))
            if size >= MIB:
                bw.append(("iperf3 4 streams", lambda: b.iperf3(size, rep, streams=4)))
            if size <= 64 * KIB:
                bw.append(("ferry rate", lambda: b.ferry("tcp", "rate", size, rep, 512)))
            for what, fn in rotate(bw, rep) + rotate(lat, rep):
                if what not in missing:
                    b.guarded(what, fn)


RECEIVE_SIZES = [64 * KIB, MIB, 8 * MIB, 64 * MIB]


def suite_receive(b, sizes, reps):
    """Fetches into memory ferry allocates (its receive pool; tool "ferry") against fetches into
    the caller's preallocated buffers ("ferry-caller"), alternating, same object, same run."""
    for rep in range(reps):
        for size in sizes:
            log(f"receive size {human(size)} rep {rep + 1}/{reps}")
            runs = [("ferry allocates", lambda: b.ferry("receive", "bw", size, rep,
                                                        bw_inflight(size),
                                                        fetch_extra=["--ferry-allocates"])),
                    ("ferry caller", lambda: b.ferry("receive", "bw", size, rep,
                                                     bw_inflight(size), tool="ferry-caller"))]
            for what, fn in rotate(runs, rep):
                b.guarded(what, fn)


def suite_python(b, sizes, reps, deadline=None):
    """ferry from Python beside ferry from C++ and beside Python's usual ways of moving an array
    between two processes (bench/python_bench.py): per size and repetition each tool once, the
    order rotating; bandwidth with bw_inflight(size) transfers outstanding, latency (1 in
    flight) at PYTHON_LAT_SIZES. No repetition after the first starts past `deadline`."""
    for rep in range(reps):
        if rep > 0 and deadline and time.time() > deadline:
            log(f"python: time budget reached after {rep} of {reps} repetitions")
            b.samples.append({"suite": "python", "budget_reps": rep})
            break
        for size in sizes:
            log(f"python size {human(size)} rep {rep + 1}/{reps}")
            k = bw_inflight(size)
            bw = [("ferry-cpp", lambda: b.ferry("python", "bw", size, rep, k, tool="ferry-cpp")),
                  ("ferry-cpp-alloc", lambda: b.ferry("python", "bw", size, rep, k,
                                                      tool="ferry-cpp-alloc",
                                                      fetch_extra=["--ferry-allocates"])),
                  ("ferry-cpp-cma", lambda: b.ferry("python", "bw", size, rep, k,
                                                    tool="ferry-cpp-cma",
                                                    env={"FERRY_CMA_PREFERRED": "1"}))]
            bw += [(f"python {t}", lambda t=t: b.python("bw", t, size, rep, k))
                   for t in ["ferry", "ferry-py-alloc", "ferry-cma"] + PYTHON_PEERS]
            lat = []
            if size in PYTHON_LAT_SIZES:
                lat = [("ferry-cpp lat", lambda: b.ferry("python", "lat", size, rep, 1,
                                                         tool="ferry-cpp")),
                       ("ferry-cpp-wait lat", lambda: b.ferry("python", "lat", size, rep, 1,
                                                              tool="ferry-cpp-wait",
                                                              fetch_extra=["--wait"]))]
                lat += [(f"python {t} lat", lambda t=t: b.python("lat", t, size, rep, 1))
                        for t in ["ferry", "ferry-wait"] + PYTHON_PEERS]
            for what, fn in rotate(bw, rep) + (rotate(lat, rep) if lat else []):
                b.guarded(what, fn)


def suite_rdma(b, sizes, reps):
    host = os.environ["FERRY_RDMA_PEER_IP"]
    env = {"FERRY_TRANSPORT": "rdma"}
    for rep in range(reps):
        for size in sizes:
            log(f"rdma size {human(size)} rep {rep + 1}/{reps}")
            bw = [("ferry", lambda: b.ferry("rdma", "bw", size, rep, bw_inflight(size), host, env)),
                  ("ib_read_bw", lambda: b.perftest("ib_read_bw", size, rep))]
            lat = [("ferry lat", lambda: b.ferry("rdma", "lat", size, rep, 1, host, env)),
                   ("ib_read_lat", lambda: b.perftest("ib_read_lat", size, rep))]
            if size <= 4 * KIB:
                lat.append(("ferry busy-poll", lambda: b.ferry(
                    "rdma", "lat", size, rep, 1, host, env, "ferry-busypoll", ["--busy-poll"])))
                # Where a fetch's time goes: its control messages cross TCP in the same guest.
                lat.append(("ferry over TCP", lambda: b.ferry(
                    "rdma", "lat", size, rep, 1, host, {"FERRY_TRANSPORT": "tcp"}, "ferry-tcp")))
                lat.append(("raw pingpong", lambda: b.pingpong(size, rep, host, "rdma")))
                # What per-peer grants cost (on rxe: a registration per grant): the owner
                # grants region rkeys instead.
                lat.append(("ferry regions", lambda: b.ferry(
                    "rdma", "lat", size, rep, 1, host, env, "ferry-regions",
                    serve_extra=["--grants", "regions"])))
            for what, fn in rotate(bw, rep) + rotate(lat, rep):
                b.guarded(what, fn)


def suite_registration(b, host, env, quick, grants="auto"):
    views, tensors = (1000, 100) if quick else (10000, 1000)
    argv = [b.fb, "registration", "--host", host, "--views", str(views), "--tensors",
            str(tensors), "--grants", grants]
    p = Proc(argv, env=env)
    rc, out, err, _ = p.wait(240 if quick else 1200)
    if rc != 0:
        raise RuntimeError(f"registration exited {rc}: {err[-800:]}")
    for line in out.strip().splitlines():
        r = json.loads(line)
        b.add(suite="registration", tool="ferry", transport=r["transport"], case=r["case"],
              count=r["count"], size=r["bytes"], raw=r)


def suite_scale(b, quick):
    size = 64 * KIB
    # A fetcher reissues from its completion handler, a moment before the server has retired
    # the request: 4,096 in flight over one peer needs headroom above the default bound (4,096).
    srv = Proc([b.fb, "serve", "--listen", "127.0.0.1:0", "--sizes", str(size),
                "--max-requests", "8192"], ready=True)
    try:
        peers = "1,16,256" if quick else "1,16,256,1024"
        p = Proc([b.fb, "scale", "--from", srv.address, "--size", str(size), "--peers", peers,
                  "--inflight", "1,4096", "--seconds", str(b.secs), "--server-pid", str(srv.pid)])
        rc, out, err, _ = p.wait(900)
        if rc != 0:
            raise RuntimeError(f"scale exited {rc}: {err[-800:]}")
    finally:
        srv.stop()
    for line in out.strip().splitlines():
        r = json.loads(line)
        b.add(suite="scale", tool="ferry", size=size, peers=r["peers"], inflight=r["inflight"],
              gbps=r["gbps"], p50_us=r["p50_us"], p99_us=r["p99_us"],
              fetches_per_s=r["fetches_per_s"], raw=r)


def suite_misc(b, host="127.0.0.1", env=None, suite="tcp"):
    out = subprocess.run([b.fb, "memcpy", "--size", "64M"], capture_output=True, text=True,
                         timeout=60).stdout
    r = json.loads(out)
    b.add(suite=suite, metric="memcpy", tool="memcpy", size=64 * MIB, gbps=r["gbps"])
    srv = Proc([b.fb, "serve", "--listen", f"{host}:0", "--sizes", "8"], env=env, ready=True)
    try:
        p = Proc([b.fb, "fetch", "--from", srv.address, "--size", "8", "--inflight", "0",
                  "--seconds", "3", "--server-pid", str(srv.pid)], env=env)
        rc, out, err, _ = p.wait(60)
    finally:
        srv.stop()
    if rc != 0:
        raise RuntimeError(f"idle exited {rc}: {err[-400:]}")
    r = json.loads(out)
    b.add(suite=suite, metric="idle", tool="ferry", transport=r["transport"],
          cpu_idle_pct=100 * (r["cpu_client_s"] + r["cpu_server_s"]) / r["seconds"], raw=r)


def run_ranks(argvs, timeout, env=None):
    """Starts one process per argv (each in a session of its own), waits for all of them with one
    deadline, and kills (SIGTERM, then SIGKILL to the whole process group) whatever is left at
    the deadline or once one has failed. Returns [(rc, stdout, stderr)] in argv order."""
    e = dict(os.environ)
    e.update(env or {})
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=e, text=True, start_new_session=True)
             for a in argvs]
    deadline = time.time() + timeout
    results = [None] * len(procs)
    failed = False
    try:
        while any(r is None for r in results):
            for i, p in enumerate(procs):
                if results[i] is not None:
                    continue
                try:  # communicate() drains both pipes, so a chatty child cannot block
                    out, err = p.communicate(timeout=0.05)
                except subprocess.TimeoutExpired:
                    continue
                results[i] = (p.returncode, out, err)
                failed |= p.returncode != 0
            if failed or time.time() > deadline:
                break
    finally:
        for i, p in enumerate(procs):
            if results[i] is not None:
                continue
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    out, err = p.communicate(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    out, err = "", ""
            results[i] = (124 if not failed else (p.returncode or 143), out or "", err or "")
    return results


def allreduce_tool(b, tool, n, sizes, samples, calls, warmup):
    """One run of `tool` over every size: n local ranks; returns rank 0's JSON lines. Raises
    SkipTool when the tool is not built / not installed. A tool "ferry:NAME" is ferry-bench
    allreduce with the extra arguments --allreduce-variants gave NAME."""
    size_arg = ",".join(map(str, sizes))
    common = ["--sizes", size_arg, "--reps", str(samples), "--calls", str(calls),
              "--warmup", str(warmup)]
    # Bound: 60 s to start and join, and ~2 s per size per call at most (far above the slowest
    # tool's 64 MiB allreduce on the 2-core VM, ~0.3 s).
    timeout = 60 + len(sizes) * (samples * (calls + 1) + warmup) * 2
    here = os.path.dirname(b.fb)
    env = None
    if tool == "mpi" or tool.startswith("mpi:"):
        if tool != "mpi":  # Open MPI's tuned component, made to run that one algorithm
            env = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                   "OMPI_MCA_coll_tuned_allreduce_algorithm": b.args.mpi_variants[tool]}
        exe = os.path.join(here, "mpi-allreduce")
        if not os.access(exe, os.X_OK):
            raise SkipTool("mpi-allreduce not built (libopenmpi-dev was not installed when the "
                           "build was configured; make bench installs it and reconfigures)")
        mpirun = shutil.which("mpirun")
        if not mpirun:
            raise SkipTool("mpirun not found (openmpi-bin)")
        # TCP like the others: the shared-memory BTL (vader) and UCX are excluded on purpose.
        argvs = [[mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                  "-np", str(n), "--timeout", str(timeout), "--mca", "pml", "ob1",
                  "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo",
                  exe] + common]
    else:
        ferry = is_ferry(tool)
        exe = b.fb if ferry else os.path.join(here, "gloo-allreduce")
        if not os.access(exe, os.X_OK):
            raise SkipTool("gloo-allreduce not built (libgloo-dev was not installed when the "
                           "build was configured; make bench installs it and reconfigures)")
        import tempfile
        rdv = tempfile.mkdtemp(prefix="ferry-bench-allreduce-")
        sub = ["allreduce"] + b.args.allreduce_variants.get(tool, []) if ferry else []
        argvs = [[exe] + sub + ["--rank", str(r), "--ranks", str(n), "--rendezvous", rdv,
                                "--host", "127.0.0.1"] + common for r in range(n)]
    try:
        results = run_ranks(argvs, timeout + 30, env)
    finally:
        if not tool.startswith("mpi"):
            shutil.rmtree(rdv, ignore_errors=True)
    bad = [(i, rc, err) for i, (rc, _, err) in enumerate(results) if rc != 0]
    if bad:
        i, rc, err = bad[0]
        what = "timed out" if rc == 124 else f"exited {rc}"
        raise RuntimeError(f"{tool} allreduce: process {i} of {len(results)} {what}: "
                           f"{err.strip()[-600:]}")
    lines = [json.loads(l) for l in results[0][1].splitlines() if l.startswith("{")]
    if len(lines) != len(sizes):
        raise RuntimeError(f"{tool} allreduce: {len(lines)} result lines for {len(sizes)} sizes")
    return lines


class SkipTool(Exception):
    pass


def is_ferry(tool):
    """ferry itself or one of its --allreduce-variants ("ferry:NAME")."""
    return tool == "ferry" or tool.startswith("ferry:")


def suite_allreduce(b, n, sizes, reps, samples, calls, warmup, deadline=None):
    """ferry (and its --allreduce-variants), Gloo and Open MPI at n ranks, alternating (the order
    rotates by repetition); each run is n fresh processes that sweep every size. With a
    deadline, no repetition starts after it (the first always runs). First one discarded run of
    each tool (one sample per size): on the 2-vCPU VM the first seconds of load after an idle
    spell are slower for whichever tool runs then (four trials each after 8 s idle: Open MPI's
    1 MiB 0.81-1.01 ms in the first run against 0.67-0.69 warm; ferry's first run of an
    invocation was slow in three of four suites, 0.97-1.39 against 0.69-0.72 in its later runs),
    and the rotation would hand that to the tool that goes first."""
    tools = (["ferry"] + list(b.args.allreduce_variants) + ALLREDUCE_PEERS +
             list(b.args.mpi_variants))
    log(f"allreduce, {n} ranks, warm-up: one discarded run of each tool")
    for tool in tools:
        try:
            allreduce_tool(b, tool, n, sizes, 1, calls, warmup)
        except Exception as e:  # the measured runs report it (SKIPPED or a failure)
            log(f"allreduce warm-up {tool}: {e}")
    skipped = {}
    for rep in range(reps):
        if rep > 0 and deadline and time.time() > deadline:
            log(f"allreduce, {n} ranks: time budget reached after {rep} of {reps} repetitions")
            b.samples.append({"suite": "allreduce", "ranks": n, "budget_reps": rep})
            break
        for tool in rotate(tools, rep):
            if tool in skipped:
                continue
            log(f"allreduce {tool}, {n} ranks, rep {rep + 1}/{reps}")

            def one(tool=tool, rep=rep):
                try:
                    lines = allreduce_tool(b, tool, n, sizes, samples, calls, warmup)
                except SkipTool as e:
                    skipped[tool] = str(e)
                    log(f"SKIPPED: allreduce {tool}: {e}")
                    b.samples.append({"suite": "allreduce", "tool": tool, "ranks": n,
                                      "skipped": str(e)})
                    return
                for r in lines:
                    b.add(suite="allreduce", metric="bw", tool=tool, size=r["size"], rep=rep,
                          ranks=n, argv=b.args.allreduce_variants.get(tool, []),
                          algorithm=b.args.mpi_variants.get(tool),
                          gbps=r["busbw_gbps"], busbw_gbps=r["busbw_gbps"],
                          algbw_gbps=r["algbw_gbps"], median_s=r["median_s"],
                          samples_s=r["samples_s"], raw=r)
            b.guarded(f"allreduce {tool} ({n} ranks)", one)


# ---------------------------------------------------------------- report

def fmt(s, key_digits=3):
    if not s:
        return "-"
    m = s["median"]
    if s["n"] == 1:
        return f"{m:.{key_digits}g}"
    return f"{m:.{key_digits}g} [{s['min']:.{key_digits}g}-{s['max']:.{key_digits}g}]"




PEERS = {
    ("tcp", "bw"): ["raw-stream", "iperf3", "iperf3-P4", "ucx-tag_bw", "ucx-ucp_get", "qperf"],
    ("receive", "bw"): ["ferry-caller"],
    ("tcp", "lat"): ["raw-pingpong", "sockperf", "qperf-rtt"],
    ("rdma", "bw"): ["ib_read_bw"],
    ("rdma", "lat"): ["ib_read_lat", "ferry-busypoll", "ferry-regions", "ferry-tcp", "raw-pingpong"],
}




def table(samples, suite, metric):
    key = "gbps" if metric == "bw" else "p50_us"
    unit = "GB/s" if metric == "bw" else "p50 us"
    ferry = medians(samples, suite, metric, "ferry", key)
    if not ferry:
        return []
    peers = [p for p in PEERS[(suite, metric)] if medians(samples, suite, metric, p, key)]
    lines = [f"\n{suite.upper()} {'bandwidth' if metric == 'bw' else 'latency'} ({unit}; "
             f"median [min-max] of the repetitions; ratio = ferry / peer in each repetition, "
             f"median [min-max])"]
    head = f"{'size':>6} {'ferry':>22}"
    for p in peers:
        head += f" | {p:>22} {'ratio':>16}"
    lines.append(head)
    extra = []
    for size in sorted(ferry):
        f = ferry[size]
        row = f"{human(size):>6} {fmt(f):>22}"
        for p in peers:
            ps = medians(samples, suite, metric, p, key).get(size)
            ratio = paired_ratios(samples, suite, metric, p, key, size)
            row += f" | {fmt(ps):>22} {fmt(ratio, 2):>16}"
        lines.append(row)
        if metric == "lat":
            p99 = stat([s.get("p99_us") for s in samples if s.get("suite") == suite and
                        s.get("metric") == "lat" and s.get("tool") == "ferry" and
                        s.get("size") == size])
            extra.append(f"{human(size):>6} ferry p99 {fmt(p99)} us")
        else:
            cpu = stat([s.get("cpu_s_per_gb") for s in samples if s.get("suite") == suite and
                        s.get("metric") == "bw" and s.get("tool") == "ferry" and
                        s.get("size") == size])
            fps = stat([s.get("fetches_per_s") for s in samples if s.get("suite") == suite and
                        s.get("metric") == "bw" and s.get("tool") == "ferry" and
                        s.get("size") == size])
            extra.append(f"{human(size):>6} ferry {fmt(fps)} fetches/s, CPU {fmt(cpu)} s/GB")
    lines += extra
    return lines


def paired(samples, suite, metric, num, den, key, size, diff=False):
    """num / den (diff: num - den) within each repetition, as paired_ratios does for ferry /
    peer, for any two tools: a stat, or None."""
    by_rep = {}
    for s in samples:
        if (s.get("suite") == suite and s.get("metric") == metric and s.get("size") == size
                and s.get("tool") in (num, den) and isinstance(s.get(key), (int, float))):
            by_rep.setdefault(s.get("rep"), {})[s["tool"]] = s[key]
    return stat([(r[num] - r[den]) if diff else r[num] / r[den] for r in by_rep.values()
                 if num in r and den in r and (diff or r[den])])


PYTHON_BW_COLUMNS = [  # (heading, tool), and the ratio heading beside it, (num, den)
    ("ferry-py", "ferry", None),
    ("ferry-cpp", "ferry-cpp", ("py/cpp", "ferry", "ferry-cpp")),
    ("ferry-py-alloc", "ferry-py-alloc", None),
    ("ferry-cpp-alloc", "ferry-cpp-alloc", ("py/cpp alloc", "ferry-py-alloc", "ferry-cpp-alloc")),
    ("shm-pickle", "shm-pickle", ("ferry/shm", "ferry", "shm-pickle")),
    ("torch-gloo", "torch-gloo", ("ferry/gloo", "ferry", "torch-gloo")),
    ("pickle-socket", "pickle-socket", ("ferry/pickle", "ferry", "pickle-socket")),
    # The same-host transport: both processes prefer CMA (FERRY_CMA_PREFERRED=1).
    ("ferry-py-cma", "ferry-cma", ("cma/gloo", "ferry-cma", "torch-gloo")),
    ("ferry-cpp-cma", "ferry-cpp-cma", ("py/cpp cma", "ferry-cma", "ferry-cpp-cma")),
]


def python_tables(samples):
    lines = [f"\nSKIPPED: python {s['tool']}: {s['skipped']}" for s in samples
             if s.get("suite") == "python" and s.get("skipped")]
    sizes = sorted({s["size"] for s in samples if s.get("suite") == "python" and
                    s.get("metric") == "bw" and "gbps" in s})
    if sizes:
        lines.append("\nPYTHON bandwidth, loopback, two processes (GB/s; median [min-max] of the "
                     "repetitions; ratios within each repetition, median [min-max]; ferry-py = "
                     "ferry from Python into numpy buffers, -alloc = into ferry's memory, "
                     "-cpp = ferry-bench fetch)")
        head = f"{'size':>6}"
        for name, _, r in PYTHON_BW_COLUMNS:
            head += f" | {name:>18}" + (f" {r[0]:>16}" if r else "")
        lines.append(head)
        for size in sizes:
            row = f"{human(size):>6}"
            for _, tool, r in PYTHON_BW_COLUMNS:
                row += f" | {fmt(medians(samples, 'python', 'bw', tool, 'gbps').get(size)):>18}"
                if r:
                    rs = paired(samples, "python", "bw", r[1], r[2], "gbps", size)
                    row += f" {fmt(rs, 2):>16}"
            lines.append(row)
        for size in sizes:
            cells = []
            for tool in ("ferry", "ferry-cpp", "shm-pickle", "torch-gloo", "pickle-socket"):
                cpu = stat([s.get("cpu_s_per_gb") for s in samples if s.get("suite") == "python"
                            and s.get("metric") == "bw" and s.get("tool") == tool and
                            s.get("size") == size])
                faults = stat([(s.get("raw") or {}).get("faults_per_transfer") for s in samples
                               if s.get("suite") == "python" and s.get("metric") == "bw" and
                               s.get("tool") == tool and s.get("size") == size])
                if cpu or faults:
                    cells.append(f"{tool} {fmt(cpu)} s/GB" +
                                 (f", {faults['median']:.3g} faults" if faults else ""))
            lines.append(f"{human(size):>6} CPU (both sides) and page faults per transfer: "
                         + "; ".join(cells))
    lat_sizes = sorted({s["size"] for s in samples if s.get("suite") == "python" and
                        s.get("metric") == "lat" and "p50_us" in s})
    if lat_sizes:
        lines.append("\nPYTHON latency, 1 in flight (p50 us; median [min-max] of the repetitions; "
                     "ferry-py: reissued from done-callbacks, ferry-wait: a loop of "
                     "fetch().result(); the C++ tools the same two ways, ferry-cpp reissuing from "
                     "the completion handler, ferry-cpp-wait a loop of fetch().wait(); x-cpp = "
                     "its p50 - its C++ counterpart's p50 within each repetition)")
        tools = ["ferry", "ferry-wait", "ferry-cpp", "ferry-cpp-wait"] + PYTHON_PEERS
        head = f"{'size':>6}" + "".join(f" | {('ferry-py' if t == 'ferry' else t):>18}"
                                        for t in tools)
        lines.append(head + f" | {'py-cpp us':>18} | {'wait-cpp us':>18} | {'ferry-py p99':>18}")
        for size in lat_sizes:
            row = f"{human(size):>6}"
            for t in tools:
                row += f" | {fmt(medians(samples, 'python', 'lat', t, 'p50_us').get(size)):>18}"
            d = paired(samples, "python", "lat", "ferry", "ferry-cpp", "p50_us", size, diff=True)
            w = paired(samples, "python", "lat", "ferry-wait", WAIT_PEER, "p50_us", size,
                       diff=True)
            p99 = medians(samples, "python", "lat", "ferry", "p99_us").get(size)
            lines.append(row + f" | {fmt(d):>18} | {fmt(w):>18} | {fmt(p99):>18}")
        for size in lat_sizes:
            raw = [s["raw"] for s in samples if s.get("suite") == "python" and
                   s.get("metric") == "lat" and s.get("tool") == "ferry" and
                   s.get("size") == size and isinstance(s.get("raw"), dict)]
            parts = [(k, stat([r.get(k) for r in raw])) for k in
                     ("native_p50_us", "python_extra_p50_us", "issue_call_p50_us")]
            if any(v for _, v in parts):
                lines.append(f"{human(size):>6} ferry-py, where the time goes (p50 us): ferry's "
                             f"own span {fmt(parts[0][1])}, Python's span beyond it "
                             f"{fmt(parts[1][1])}, the issuing call {fmt(parts[2][1])}")
    return lines


def python_markdown(samples):
    """The python suite's tables in Markdown (appended to tables.md)."""
    sizes = sorted({s["size"] for s in samples if s.get("suite") == "python" and
                    s.get("metric") == "bw" and "gbps" in s})
    if not sizes:
        return ""

    def cell(x, ratio=False):
        if not x:
            return ""
        d = (lambda v: f"{v:.2g}") if ratio else (lambda v: f"{v:,.0f}" if v >= 1000 else
                                                  f"{v:.3g}")
        return f"{d(x['median'])} [{d(x['min'])}–{d(x['max'])}]" if ratio else d(x["median"])

    out = ["", "**Python, loopback, bandwidth (GB/s)**", ""]
    names = ["size"]
    for name, _, r in PYTHON_BW_COLUMNS:
        names += [name] + ([r[0]] if r else [])
    out += ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
    for size in sizes:
        cells = [human(size).replace("K", " KiB").replace("M", " MiB")]
        for _, tool, r in PYTHON_BW_COLUMNS:
            cells.append(cell(medians(samples, "python", "bw", tool, "gbps").get(size)))
            if r:
                cells.append(cell(paired(samples, "python", "bw", r[1], r[2], "gbps", size), True))
        out.append("| " + " | ".join(cells) + " |")
    lat_sizes = sorted({s["size"] for s in samples if s.get("suite") == "python" and
                        s.get("metric") == "lat" and "p50_us" in s})
    if lat_sizes:
        tools = ["ferry", "ferry-wait", "ferry-cpp", "ferry-cpp-wait"] + PYTHON_PEERS
        names = (["size"] + [("ferry-py" if t == "ferry" else t) + " p50" for t in tools] +
                 ["ferry-py − ferry-cpp", f"ferry-wait − {WAIT_PEER}", "ferry-py p99"])
        out += ["", "**Python, loopback, latency, 1 in flight (µs)**", "",
                "| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
        for size in lat_sizes:
            cells = [human(size).replace("K", " KiB").replace("M", " MiB")]
            cells += [cell(medians(samples, "python", "lat", t, "p50_us").get(size)) for t in tools]
            for t, peer in (("ferry", "ferry-cpp"), ("ferry-wait", WAIT_PEER)):
                d = paired(samples, "python", "lat", t, peer, "p50_us", size, diff=True)
                cells.append(f"{d['median']:.0f} [{d['min']:.0f}–{d['max']:.0f}]" if d else "")
            cells.append(cell(medians(samples, "python", "lat", "ferry", "p99_us").get(size)))
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def rate_table(samples):
    rate = medians(samples, "tcp", "rate", "ferry", "fetches_per_s")
    if not rate:
        return []
    lines = ["\nTCP fetches per second, 512 in flight (median [min-max])"]
    for size in sorted(rate):
        lines.append(f"{human(size):>6} {fmt(rate[size])}")
    return lines


def targets(samples):
    """The issue's targets, evaluated on this run's medians."""
    out = ["\nTargets (medians of this run)"]

    def med(suite, metric, tool, size, key):
        s = medians(samples, suite, metric, tool, key).get(size)
        return s["median"] if s else None

    def ratio(suite, metric, tool, size, key):
        r = paired_ratios(samples, suite, metric, tool, key, size)
        return r["median"] if r else None

    def verdict(ok):
        return "MET" if ok else "SHORT"

    def target(what, r, goal, at_most=False):
        """Appends `what = r (target >= goal): MET|SHORT` (<= with at_most); nothing where r is
        None or 0 (not measured). Returns whether it appended."""
        if not r:
            return False
        op, met = ("<=", r <= goal) if at_most else (">=", r >= goal)
        out.append(f"  {what} = {r:.2f} (target {op} {goal}): {verdict(met)}")
        return True

    for size in sorted({s["size"] for s in samples if s.get("suite") == "tcp" and
                        s.get("metric") == "bw" and s.get("tool") == "ferry"}):
        if size < MIB:
            continue
        # The best streaming peer of this size: the higher median of iperf3 and ucx tag_bw.
        peers = [(med("tcp", "bw", t, size, "gbps") or 0, t) for t in ("iperf3", "ucx-tag_bw")]
        best = max(peers)[1]
        target(f"TCP {human(size)}: ferry / best streaming peer ({best})",
               ratio("tcp", "bw", best, size, "gbps"), 1.0)
        target(f"TCP {human(size)}: ferry / raw stream into as many buffers",
               ratio("tcp", "bw", "raw-stream", size, "gbps"), 0.95)
        target(f"TCP {human(size)}: ferry / ucx ucp_get",
               ratio("tcp", "bw", "ucx-ucp_get", size, "gbps"), 3.0)
    for size in sorted({s["size"] for s in samples if s.get("suite") == "tcp" and
                        s.get("metric") == "lat" and s.get("tool") == "ferry"}):
        if size > 4 * KIB:
            continue
        target(f"TCP {human(size)} latency p50: ferry / raw ping-pong",
               ratio("tcp", "lat", "raw-pingpong", size, "p50_us"), 1.3, at_most=True)
    for size in sorted({s["size"] for s in samples if s.get("suite") == "rdma" and
                        s.get("tool") == "ferry" and "size" in s}):
        if size >= 64 * KIB:
            target(f"RDMA {human(size)}: ferry / ib_read_bw",
                   ratio("rdma", "bw", "ib_read_bw", size, "gbps"), 0.95)
        if size <= 4 * KIB:
            target(f"RDMA {human(size)} latency p50: ferry / ib_read_lat",
                   ratio("rdma", "lat", "ib_read_lat", size, "p50_us"), 1.3, at_most=True)
    for size in sorted(medians(samples, "receive", "bw", "ferry", "gbps")):
        target(f"TCP {human(size)}: into ferry's memory / into the caller's buffers",
               ratio("receive", "bw", "ferry-caller", size, "gbps"), 0.9)
    for s in samples:
        if s.get("suite") == "registration" and s.get("case") == "views":
            r = s["raw"]
            ms = r["registration_s"] * 1e3
            grants = f", {grant_label(r)}" if r["transport"] == "RDMA" else ""
            out.append(f"  {r['count']} x {human(r['bytes'])} views ({r['transport']}{grants}) "
                       f"registered in {ms:.1f} ms (target < 100 ms): {verdict(ms < 100)}")
    for n, sub in by_ranks(samples):
        for size in sorted(medians(sub, "allreduce", "bw", "ferry", "busbw_gbps")):
            if size == 64 * KIB:
                r = paired_ratios(sub, "allreduce", "bw", "mpi", "busbw_gbps", size)
                if r:
                    out.append(f"  allreduce 64K, {n} ranks: ferry / mpi = {r['median']:.2f} "
                               f"(target >= 0.8): {verdict(r['median'] >= 0.8)}")
            if size < MIB:
                continue
            # The better peer of this size: the higher median busbw of Gloo and Open MPI.
            best, r = better_allreduce_peer(sub, size)
            if r:
                out.append(f"  allreduce {human(size)}, {n} ranks: ferry / better peer "
                           f"({best}) = {r['median']:.2f} (target >= 1.0): "
                           f"{verdict(r['median'] >= 1.0)}")
            else:
                out.append(f"  allreduce {human(size)}, {n} ranks: not evaluated (no peer "
                           "measured: SKIPPED or failed, see above)")
    for size in sorted({s["size"] for s in samples if s.get("suite") == "python" and
                        s.get("metric") == "bw" and "gbps" in s}):
        if size < MIB:
            continue
        if not med("python", "bw", "ferry", size, "gbps"):
            out.append(f"  Python {human(size)}: not evaluated (ferry from Python not measured: "
                       "SKIPPED or failed, see above)")
            continue
        for num, den, what in (("ferry", "ferry-cpp", "into buffers"),
                               ("ferry-py-alloc", "ferry-cpp-alloc", "into ferry's memory")):
            r = paired(samples, "python", "bw", num, den, "gbps", size)
            if r:
                out.append(f"  Python {human(size)}: ferry from Python / from C++ ({what}) = "
                           f"{r['median']:.2f} (target >= 0.95): {verdict(r['median'] >= 0.95)}")
        # The better of torch-gloo and pickle-socket: the higher median of this size.
        peers = [((med("python", "bw", t, size, "gbps") or 0), t)
                 for t in ("torch-gloo", "pickle-socket")]
        best_bw, best = max(peers)
        if not target(f"Python {human(size)}: ferry / better of torch-gloo and pickle-socket "
                      f"({best})", ratio("python", "bw", best, size, "gbps") if best_bw else None,
                      1.5):
            out.append(f"  Python {human(size)}: ferry / torch-gloo, pickle-socket: not evaluated "
                       "(neither measured: SKIPPED or failed, see above)")
        target(f"Python {human(size)}: ferry / shm-pickle",
               ratio("python", "bw", "shm-pickle", size, "gbps"), 1.0)
        if best_bw and med("python", "bw", "ferry-cma", size, "gbps"):
            target(f"Python {human(size)}: ferry over CMA (one host) / better of torch-gloo and "
                   f"pickle-socket ({best})",
                   (paired(samples, "python", "bw", "ferry-cma", best, "gbps", size) or
                    {}).get("median"), 1.5)
    for size in sorted({s["size"] for s in samples if s.get("suite") == "python" and
                        s.get("metric") == "lat" and "p50_us" in s}):
        for tool, peer, how in (("ferry", "ferry-cpp", "reissued from callbacks"),
                                ("ferry-wait", WAIT_PEER, "result() loop")):
            d = paired(samples, "python", "lat", tool, peer, "p50_us", size, diff=True)
            if d:
                out.append(f"  Python {human(size)} latency p50, {how}: ferry from Python - from "
                           f"C++ = {d['median']:+.1f} us (target <= +15 us): "
                           f"{verdict(d['median'] <= 15)}")
    for s in samples:
        if s.get("metric") == "idle":
            out.append(f"  idle CPU with a peer connected ({s['transport']}): "
                       f"{s['cpu_idle_pct']:.2f} % of a core (both processes)")
    return out


def variant_table(samples, sizes, prefix, setting, ratio_name, column, title, ratio):
    """Lines of a table of the allreduce tools named `prefix`NAME (ferry's --allreduce-variants,
    Open MPI's --mpi-variants): each one's busbw and `ratio(tool, size)` (`ratio_name`, its
    column headed `column` with NAME for {}) at each of `sizes`; `setting`: the sample key that
    says what the tool ran with."""
    tools = sorted({s["tool"] for s in samples if s.get("suite") == "allreduce" and
                    s.get("tool", "").startswith(prefix) and "busbw_gbps" in s})
    if not tools:
        return []
    said = {}
    for s in samples:
        if s.get("suite") == "allreduce" and s.get("tool") in tools:
            value = s.get(setting)
            said[s["tool"]] = " ".join(value) if isinstance(value, list) else value
    short = {t: t[len(prefix):] for t in tools}
    label = {t: column.format(short[t]) for t in tools}
    lines = [f"\n{title} (busbw GB/s, median [min-max]; ratio = {ratio_name} within each run): " +
             "; ".join(f"{short[t]} = {said.get(t) or '?'}" for t in tools),
             f"{'size':>6} " + " ".join(f"{short[t] + ' busbw':>22} {label[t]:>14}" for t in tools)]
    for size in sorted(sizes):
        row = f"{human(size):>6} "
        for t in tools:
            ps = medians(samples, "allreduce", "bw", t, "busbw_gbps").get(size)
            row += f"{fmt(ps):>22} {fmt(ratio(t, size), 2):>14} "
        lines.append(row.rstrip())
    return lines


def allreduce_table(samples, n):
    ferry = medians(samples, "allreduce", "bw", "ferry", "busbw_gbps")
    lines = []
    for s in samples:
        if s.get("suite") == "allreduce" and s.get("skipped"):
            lines.append(f"\nSKIPPED: allreduce {s['tool']} ({n} ranks): {s['skipped']}")
        if s.get("suite") == "allreduce" and s.get("budget_reps"):
            lines.append(f"\nallreduce, {n} ranks: {s['budget_reps']} repetitions (the time "
                         "budget ended the suite there)")
    if not ferry:
        return lines
    peers = [p for p in ALLREDUCE_PEERS if medians(samples, "allreduce", "bw", p, "busbw_gbps")]
    runs = len({s.get("rep") for s in samples if s.get("suite") == "allreduce" and
                s.get("tool") == "ferry" and "median_s" in s})
    lines.append(f"\nAllreduce, {n} local ranks over loopback TCP, float32 sum "
                 "(time per call: calls back to back, the mean over ranks, as NCCL's tests time "
                 "them; busbw GB/s = size / time * 2(n-1)/n, their definition; median [min-max] "
                 f"of {runs} runs' medians; ratio = ferry / peer within each run, median "
                 "[min-max])")
    head = f"{'size':>6} {'ferry ms':>10} {'ferry busbw':>22}"
    for p in peers:
        head += f" | {p + ' busbw':>22} {'ferry/' + p:>16}"
    lines.append(head)
    for size in sorted(ferry):
        ms = stat([s["median_s"] * 1e3 for s in samples if s.get("suite") == "allreduce" and
                   s.get("tool") == "ferry" and s.get("size") == size and "median_s" in s])
        row = f"{human(size):>6} {ms['median'] if ms else 0:10.3g} {fmt(ferry[size]):>22}"
        for p in peers:
            ps = medians(samples, "allreduce", "bw", p, "busbw_gbps").get(size)
            ratio = paired_ratios(samples, "allreduce", "bw", p, "busbw_gbps", size)
            row += f" | {fmt(ps):>22} {fmt(ratio, 2):>16}"
        lines.append(row)
    usage = []
    for size in sorted(ferry):
        cells = []
        for tool in ["ferry"] + peers:
            raw = [s["raw"] for s in samples if s.get("suite") == "allreduce" and
                   s.get("tool") == tool and s.get("size") == size and
                   "cpu_us_per_call" in (s.get("raw") or {})]
            if raw:
                cpu, vol, inv = (stat([r[k] for r in raw])["median"] for k in (
                    "cpu_us_per_call", "voluntary_switches_per_call",
                    "involuntary_switches_per_call"))
                cells.append(f"{tool} {cpu:.3g} us, {vol:.2g} / {inv:.2g}")
        if cells:
            usage.append(f"{human(size):>6} " + "; ".join(cells))
    if usage:
        lines.append(f"\nPer call, {n} ranks, the mean over ranks (median of the runs): the "
                     "process's CPU time, every thread, and its context switches, voluntary "
                     "(it slept) / involuntary (it was preempted)")
        lines.extend(usage)
    lines += variant_table(
        samples, ferry, "ferry:", "argv", "variant / ferry's default", "{}/ferry",
        f"ferry's variants, {n} ranks",
        lambda v, size: paired(samples, "allreduce", "bw", v, "ferry", "busbw_gbps", size))
    lines += variant_table(
        samples, ferry, "mpi:", "algorithm", "ferry / it", "ferry/{}",
        f"Open MPI made to run one allreduce algorithm, {n} ranks "
        "(coll_tuned_allreduce_algorithm)",
        lambda a, size: paired_ratios(samples, "allreduce", "bw", a, "busbw_gbps", size))
    return lines


def other_tables(samples):
    lines = []
    reg = [s for s in samples if s.get("suite") == "registration"]
    if reg:
        lines.append("\nRegistration (reg ms = put + the owner's time in ibv_reg_mr, timed "
                     "around each call: the owner registers lazily, at an object's first grant; pass 1 and 2 fetch "
                     "every object, 16 in flight; reissued = fetches issued again after their "
                     "data channel broke, e.g. an rxe queue pair left without completions for "
                     "the 10 s stall timeout)")
        lines.append(f"{'case':>26} {'transport':>9} {'put ms':>8} {'reg ms':>8} "
                     f"{'pass1 s':>8} {'pass2 s':>8} {'GB/s':>6} {'owner regs':>10} "
                     f"{'fetcher regs':>12} {'reissued':>8}")
        for s in reg:
            r = s["raw"]
            oc = (r.get("owner_counters") or {}).get("registrations", "-")
            fc = (r.get("fetcher_counters") or {}).get("registrations", "-")
            name = f"{r['count']} x {human(r['bytes'])} {r['case']}"
            if r["transport"] == "RDMA":
                name += f" ({grant_label(r)})"
            lines.append(f"{name:>26} {r['transport']:>9} {r['put_s'] * 1e3:8.1f} "
                         f"{r['registration_s'] * 1e3:8.1f} {r['pass1_s']:8.2f} "
                         f"{r['pass2_s']:8.2f} {r['pass2_gbps']:6.2f} {oc:>10} {fc:>12} "
                         f"{r.get('reissued', '-'):>8}")
    sc = [s for s in samples if s.get("suite") == "scale"]
    if sc:
        lines.append("\nScale (TCP, 64 KiB objects, one server; RSS in MiB)")
        lines.append(f"{'peers':>6} {'inflight':>8} {'GB/s':>6} {'fetches/s':>10} "
                     f"{'p50 us':>9} {'p99 us':>9} {'srv RSS idle':>12} {'srv RSS busy':>12} "
                     f"{'cli RSS busy':>12}")
        for s in sc:
            r = s["raw"]
            lines.append(f"{r['peers']:>6} {r['inflight']:>8} {r['gbps']:6.2f} "
                         f"{r['fetches_per_s']:10.0f} {r['p50_us']:9.0f} {r['p99_us']:9.0f} "
                         f"{r['server_rss_idle'] / MIB:12.1f} {r['server_rss_busy'] / MIB:12.1f} "
                         f"{r['client_rss_busy'] / MIB:12.1f}")
    for s in samples:
        if s.get("metric") == "memcpy":
            where = ("in the soft-RoCE guest, emulated" if s["suite"] == "rdma"
                     else "loopback TCP copies every byte twice")
            lines.append(f"\nSingle-core memcpy ({s['suite']}): {s['gbps']:.2f} GB/s ({where})")
    return lines


def chart(out_dir, name, series, title, xlabel, ylabel):
    """One gnuplot PNG (log-log, one line per tool) of `series` [(tool, [(size, y)])]; its path,
    or None if gnuplot made nothing."""
    png = os.path.join(out_dir, f"{name}.png")
    dat = os.path.join(out_dir, f"{name}.dat")
    with open(dat, "w") as f:
        for t, pts in series:
            f.write(f"# {t}\n")
            for x, y in pts:
                f.write(f"{x} {y}\n")
            f.write("\n\n")
    plot = ", ".join(f"'{dat}' index {i} with linespoints lw 2 title '{t}'"
                     for i, (t, _) in enumerate(series))
    script = (f"set terminal pngcairo noenhanced size 900,560 font ',11'\nset output '{png}'\n"
              f"set title '{title}'\nset logscale x 2\nset logscale y 10\n"
              "set format x '%.0b%B'\nset format y '%g'\n"
              f"set xlabel '{xlabel}'\n"
              f"set ylabel '{ylabel}'\nset grid\nset key left top\nplot {plot}\n")
    subprocess.run(["gnuplot"], input=script, text=True, check=False, timeout=60)
    return png if os.path.exists(png) else None


def median_series(samples, suite, metric, tools, key):
    """[(tool, [(size, median)])] for the tools that have samples."""
    series = []
    for t in tools:
        m = medians(samples, suite, metric, t, key)
        pts = [(size, st["median"]) for size, st in sorted(m.items()) if st]
        if pts:
            series.append((t, pts))
    return series


def plots(samples, out_dir):
    if not shutil.which("gnuplot"):
        log("gnuplot not found: no plots")
        return []
    charts = []
    for suite in ("tcp", "rdma"):
        for metric, key, ylabel in (("bw", "gbps", "GB/s"), ("lat", "p50_us", "p50 latency (us)")):
            series = median_series(samples, suite, metric, ["ferry"] + PEERS[(suite, metric)], key)
            title = f"{suite.upper()} {'bandwidth' if metric == 'bw' else 'latency'} vs size"
            charts.append((f"{suite}-{metric}", series, title, "object / message size (bytes)",
                           ylabel))
    charts.append(("python-bw", median_series(samples, "python", "bw",
                                              ["ferry", "ferry-cpp", "ferry-py-alloc",
                                               "ferry-cpp-alloc"] + PYTHON_PEERS, "gbps"),
                   "Python, loopback, two processes: bandwidth vs size (ferry = from Python)",
                   "object size (bytes)", "GB/s"))
    for n, sub in by_ranks(samples):
        charts.append((f"allreduce-busbw" + ("" if n == 4 else f"-{n}"),
                       median_series(sub, "allreduce", "bw", ["ferry"] + ALLREDUCE_PEERS,
                                     "busbw_gbps"),
                       f"Allreduce, {n} local ranks over loopback TCP, float32 sum: "
                       "bus bandwidth vs size", "allreduce size (bytes)",
                       "busbw GB/s (algbw * 2(n-1)/n)"))
    made = []
    for name, series, title, xlabel, ylabel in charts:
        if series:
            png = chart(out_dir, name, series, title, xlabel, ylabel)
            if png:
                made.append(png)
    return made


# What ferry's TCP data channels within one host use (ferry/tcp/congestion.h, kOneHostCongestion).
ONE_HOST_CONGESTION = "reno"


def machine(congestion=""):
    """congestion: what same_loopback_congestion said holds ("" when it was not used)."""
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    cc = system_congestion() or "unknown"
    if congestion:
        cc += f" ({congestion})"
    elif cc != ONE_HOST_CONGESTION:
        cc += f" ({mixed(ONE_HOST_CONGESTION, cc)})"
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"TCP congestion control {cc}, load average at start {os.getloadavg()[0]:.2f}")


def cpu_busy():
    """(busy CPU seconds of the whole machine so far, CPU seconds of this process and its reaped
    children): their deltas over a run tell how much other work ran beside it."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = None
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


def commit():
    """The source measured: the commit, "+ changes" when the work tree differs from it (in a
    bench bundle: what its VERSION file says)."""
    version = os.path.join(ROOT, "VERSION")
    if os.path.exists(version):
        for line in open(version):
            if line.startswith("source: "):
                return line[len("source: "):].strip() + " (bench bundle)"
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return head + (" + uncommitted changes" if head and dirty else "")


def report(samples, out_dir, meta):
    lines = [f"ferry bench: {meta.get('machine', '?')}", f"command: {meta['command']}"]
    if meta.get("commit"):
        lines.append(f"source: {meta['commit']}")
    if meta.get("interrupted"):
        lines.append(f"INTERRUPTED: {meta['interrupted']}")
    if "load_at_end" in meta:
        lines.append(f"load average at end {meta['load_at_end']:.2f}; took {meta.get('seconds')} s")
    if "other_cpu_s" in meta and meta.get("seconds"):
        share = meta["other_cpu_s"] / (meta["seconds"] * (os.cpu_count() or 1))
        lines.append(f"CPU used by other processes during the run: {meta['other_cpu_s']} s "
                     f"({100 * share:.0f} % of the machine)")
    for suite, metric in (("tcp", "bw"), ("receive", "bw"), ("tcp", "lat"), ("rdma", "bw"),
                          ("rdma", "lat")):
        lines += table(samples, suite, metric)
    lines += [f"\nSKIPPED: tcp {s['tool']}: {s['skipped']}" for s in samples
              if s.get("suite") == "tcp" and s.get("skipped")]
    lines += [f"\n{s['suite']}: {s['budget_reps']} repetitions (the time budget ended the suite "
              "there)" for s in samples if s.get("suite") in ("tcp", "python") and
              s.get("budget_reps")]
    lines += rate_table(samples)
    lines += other_tables(samples)
    for n, sub in by_ranks(samples):
        lines += allreduce_table(sub, n)
    lines += python_tables(samples)
    lines += targets(samples)
    reissued = [s for s in samples
                if s.get("metric") in ("bw", "lat") and isinstance(s.get("raw"), dict)
                and s["raw"].get("reissued")]
    if reissued:
        lines.append("\nSamples in which fetches were issued again after their data channel broke "
                     "(the lost time stays in the sample):")
        lines += [f"  {s['suite']} {s['metric']} {s['tool']} {human(s['size'])} rep {s['rep']}: "
                  f"{s['raw']['reissued']} reissued" for s in reissued]
    errors = [s["error"] for s in samples if "error" in s]
    if errors:
        lines.append(f"\n{len(errors)} samples failed:")
        lines += ["  " + e[:300] for e in errors]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "report.txt"), "w") as f:
        f.write(text)
    print(text, flush=True)
    with open(os.path.join(out_dir, "tables.md"), "w") as f:
        f.write(markdown.tables(samples, meta) + python_markdown(samples))


# ---------------------------------------------------------------- main

def guest_part(b, args):
    """Inside the soft-RoCE guest: the RDMA suite, RDMA registration, RDMA idle/busy-poll."""
    sizes = args.sizes or (QUICK_RDMA_SIZES if args.quick else FULL_RDMA_SIZES)
    if "rdma" in args.suites:
        suite_rdma(b, sizes, args.reps)
    host = os.environ["FERRY_RDMA_PEER_IP"]
    env = {"FERRY_TRANSPORT": "rdma"}
    if "registration" in args.suites:
        # Each grant mode the owner is asked to use: the default (per-grant registrations on
        # rxe) and region rkeys (one registration for all views). Windows hang on rxe
        # (bench/README.md): only when asked for.
        for grants in args.registration_grants.split(","):
            b.guarded(f"registration (RDMA, grants {grants})", lambda: suite_registration(
                b, host, env, args.quick, grants))
    if "misc" in args.suites:
        b.guarded("idle (RDMA)", lambda: suite_misc(b, host, env, "rdma"))


def host_part(b, args, meta, congestion):
    """The suites that run on this machine (the guest's are in guest_part)."""
    meta["machine"] = machine(congestion)
    log(f"ferry bench on {meta['machine']}")
    if "misc" in args.suites:
        b.guarded("misc", lambda: suite_misc(b))
    # With --budget, each suite may start repetitions until its share of the budget is spent
    # (weights below; the allreduce suite gets one share per rank count).
    shares = []  # in the order the suites run
    if "tcp" in args.suites:
        shares.append(("tcp", None, 2))
    if "python" in args.suites:
        shares.append(("python", None, 3))
    if "allreduce" in args.suites:
        shares += [("allreduce", n, 3) for n in args.allreduce_ranks]
    total = sum(w for _, _, w in shares) or 1
    t0 = time.time()
    deadlines, spent = {}, 0
    for suite, n, w in shares:
        spent += w
        deadlines[(suite, n)] = t0 + args.budget * spent / total if args.budget else None
    if "tcp" in args.suites:
        suite_tcp(b, args.sizes or (QUICK_TCP_SIZES if args.quick else FULL_TCP_SIZES), args.reps,
                  deadlines[("tcp", None)])
    if "receive" in args.suites:
        suite_receive(b, RECEIVE_SIZES, args.reps)
    if "registration" in args.suites:
        b.guarded("registration (TCP)", lambda: suite_registration(b, "127.0.0.1", {}, True))
    if "scale" in args.suites:
        b.guarded("scale", lambda: suite_scale(b, args.quick))
    if "python" in args.suites:
        suite_python(b, args.sizes or (QUICK_PYTHON_SIZES if args.quick else FULL_PYTHON_SIZES),
                     args.reps, deadlines[("python", None)])
    if "allreduce" in args.suites:
        for n in args.allreduce_ranks:
            suite_allreduce(b, n, args.allreduce_sizes or (QUICK_ALLREDUCE_SIZES if args.quick
                                                           else FULL_ALLREDUCE_SIZES),
                            args.allreduce_reps, args.allreduce_samples, args.allreduce_calls,
                            args.allreduce_warmup, deadlines[("allreduce", n)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ferry-bench", default=os.path.join(ROOT, "build", "bench", "ferry-bench"))
    ap.add_argument("--out", default=None, help="results folder (default: beside ferry-bench)")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, shorter runs")
    ap.add_argument("--reps", type=int, default=None,
                    help="runs per size and tool in the tcp and rdma suites (default 3, "
                         "quick 2); allreduce: --allreduce-reps")
    ap.add_argument("--seconds", type=float, default=None, help="per sample")
    ap.add_argument("--lat-iters", type=int, default=None, help="ib_read_lat iterations")
    ap.add_argument("--suites",
                    default="tcp,receive,rdma,registration,scale,misc,allreduce,python")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated sizes in bytes (tcp, rdma and python suites)")
    ap.add_argument("--python", default=os.environ.get("FERRY_BENCH_PYTHON"),
                    help="python suite: the interpreter that runs bench/python_bench.py (default: "
                         "$FERRY_BENCH_PYTHON, else the one the ferry package was built for, "
                         "named in --python-path's interpreter.txt, else this one)")
    ap.add_argument("--torch-python", default=os.environ.get("FERRY_BENCH_TORCH_PYTHON"),
                    help="python suite: the interpreter that runs the torch-gloo peer (default: "
                         "$FERRY_BENCH_TORCH_PYTHON, else --python), e.g. one that has torch where "
                         "--python (the bench bundle's) does not")
    ap.add_argument("--python-path", default=os.environ.get("FERRY_BENCH_PYTHON_PATH"),
                    help="python suite: the folder holding the ferry package (default: "
                         "$FERRY_BENCH_PYTHON_PATH, else BUILD/python, beside ferry-bench's "
                         "build folder)")
    ap.add_argument("--allreduce-sizes", default=None,
                    help="comma-separated bytes per allreduce (multiples of 4)")
    ap.add_argument("--allreduce-samples", type=int, default=None,
                    help="timed allreduce samples per size in each run (default 5, quick 3)")
    ap.add_argument("--allreduce-calls", type=int, default=None,
                    help="back-to-back allreduce calls per sample (default 10, quick 5)")
    ap.add_argument("--allreduce-warmup", type=int, default=None,
                    help="untimed allreduce calls per size before the samples (default 3, quick 2)")
    ap.add_argument("--allreduce-reps", type=int, default=None,
                    help="runs of each allreduce tool (default 7, quick 3; --reps does not set "
                         "it): one run of either tool can sit in a slow mode of the VM for its "
                         "whole length (1 MiB: 0.6, 0.9 or 1.2 ms a call), so the ratio's median "
                         "needs more paired runs than the other suites")
    ap.add_argument("--allreduce-ranks", default="4",
                    help="comma-separated rank counts for the allreduce suite (default 4)")
    ap.add_argument("--allreduce-variants", default="",
                    help="extra ferry configurations measured beside the default, "
                         "'NAME=ARGS;NAME=ARGS' (ARGS: ferry-bench allreduce options, e.g. "
                         "'ring=--ring-threshold 1M;seg2m=--ring-threshold 1M --segment 2M')")
    ap.add_argument("--mpi-variants", default="",
                    help="Open MPI allreduce algorithms measured beside its own choice, "
                         "'NAME=N;NAME=N' (N: coll_tuned_allreduce_algorithm, Open MPI 4.1: "
                         "1 basic linear, 2 nonoverlapping, 3 recursive doubling, 4 ring, "
                         "5 segmented ring, 6 Rabenseifner), e.g. 'rd=3;ring=4;rab=6'")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds: no suite starts a repetition after its share of this is spent "
                         "(the first repetition always runs; tcp, python and allreduce suites)")
    ap.add_argument("--loopback-congestion", choices=["same", "system"], default="same",
                    help="same (default): every tool's loopback connections on the algorithm "
                         "ferry's use within one host (%s), by a route's congctl for 127.0.0.1 "
                         "while the host suites run (needs root; restored after); system: Open "
                         "MPI, Gloo, UCX, qperf and sockperf keep the system's default" %
                         ONE_HOST_CONGESTION)
    ap.add_argument("--guest-mem", type=int, default=6144, help="MiB for the soft-RoCE guest")
    ap.add_argument("--registration-grants", default="auto,regions",
                    help="owner's grant modes for the RDMA registration benchmark, comma-separated "
                         "(auto, windows, registrations, regions; windows hang on rxe today)")
    ap.add_argument("--report-only", action="store_true",
                    help="no measuring: table and plots again from --out's samples.json")
    ap.add_argument("--inside-guest", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.suites = set(args.suites.split(","))
    args.allreduce_ranks = [int(x) for x in args.allreduce_ranks.split(",")]
    variants = {}
    for item in filter(None, (x.strip() for x in args.allreduce_variants.split(";"))):
        name, _, rest = item.partition("=")
        if not name or not rest:
            ap.error(f"--allreduce-variants: expected NAME=ARGS, got '{item}'")
        variants["ferry:" + name.strip()] = rest.split()
    args.allreduce_variants = variants
    mpi_variants = {}
    for item in filter(None, (x.strip() for x in args.mpi_variants.split(";"))):
        name, _, number = item.partition("=")
        if not name.strip() or not number.strip().isdigit():
            ap.error(f"--mpi-variants: expected NAME=NUMBER, got '{item}'")
        mpi_variants["mpi:" + name.strip()] = number.strip()
    args.mpi_variants = mpi_variants
    args.sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else None
    args.allreduce_sizes = ([int(x) for x in args.allreduce_sizes.split(",")]
                            if args.allreduce_sizes else None)
    # Each option left unset: its --quick default, or its full one.
    for name, quick, full in (("allreduce_samples", 3, 5), ("allreduce_calls", 5, 10),
                              ("allreduce_warmup", 2, 3), ("allreduce_reps", 3, 7),
                              ("reps", 2, 3), ("seconds", 0.5, 1.0), ("lat_iters", 300, 1000)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.python_path is None:
        args.python_path = os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(args.ferry_bench))), "python")
    args.python_path = os.path.abspath(args.python_path)
    if args.python is None:
        built_for = os.path.join(args.python_path, "interpreter.txt")
        args.python = (open(built_for).read().strip() if os.path.exists(built_for)
                       else sys.executable)
    out_dir = os.path.abspath(args.out or os.path.join(os.path.dirname(
        os.path.abspath(args.ferry_bench)), "results"))
    os.makedirs(out_dir, exist_ok=True)
    if args.report_only:
        saved = json.load(open(os.path.join(out_dir, "samples.json")))
        report(saved["samples"], out_dir, saved["meta"])
        plots(saved["samples"], out_dir)
        return
    b = Bench(args)
    b.out_dir = out_dir
    if not os.access(b.fb, os.X_OK):
        sys.exit(f"run.py: {b.fb} not built (make bench builds it)")

    if args.inside_guest:
        guest_part(b, args)
        b.save_guest_samples()
        return

    started = time.time()
    busy0 = cpu_busy()
    meta = {"command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "commit": commit()}
    # SIGTERM (a `timeout` around the run) ends the measuring, not the run: what was measured is
    # written and reported below, marked as interrupted (the congestion control's own handler,
    # while it is set, restores it on the way out).
    interrupted = None

    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        if args.loopback_congestion == "same":
            with same_loopback_congestion(ONE_HOST_CONGESTION, log) as congestion:
                host_part(b, args, meta, congestion)
        else:
            host_part(b, args, meta, "")
    except SystemExit as e:
        if e.code != 128 + signal.SIGTERM:
            raise
        interrupted = e.code
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the results get written whatever comes
    if interrupted:
        meta["interrupted"] = "SIGTERM before the run ended: the samples measured until then"
        log("interrupted (SIGTERM): writing the samples measured so far")
    elif args.suites & {"rdma", "registration", "misc"}:
        vm = os.path.join(ROOT, "tests", "softroce", "ferry-vm")
        argv = [vm, "--cwd", ROOT, "--rw", out_dir, "--mem", str(args.guest_mem),
                "--timeout", "2400", "--", "python3", os.path.join(HERE, "run.py"),
                "--inside-guest", "--ferry-bench", b.fb, "--out", out_dir,
                "--reps", str(args.reps), "--seconds", str(args.seconds),
                "--lat-iters", str(args.lat_iters), "--suites", ",".join(args.suites)]
        argv += ["--registration-grants", args.registration_grants]
        if args.sizes:
            argv += ["--sizes", ",".join(map(str, args.sizes))]
        if args.quick:
            argv.append("--quick")
        log("RDMA part: inside the soft-RoCE guest")
        rdma_file = os.path.join(out_dir, "rdma-samples.json")
        if os.path.exists(rdma_file):
            os.remove(rdma_file)
        rc = subprocess.run(argv, timeout=2700).returncode
        if rc == 77:
            log("SKIPPED: the RDMA part (the soft-RoCE guest cannot run here)")
            b.samples.append({"error": "RDMA part skipped: soft-RoCE guest cannot run here"})
        elif os.path.exists(rdma_file):
            b.samples += json.load(open(rdma_file))
        if rc not in (0, 77):
            b.samples.append({"error": f"the soft-RoCE guest exited {rc}"})
    meta["seconds"] = round(time.time() - started, 1)
    meta["load_at_end"] = os.getloadavg()[0]
    busy1 = cpu_busy()
    if busy0[0] is not None and busy1[0] is not None:
        # Kernel time spent for our processes (softirqs of their traffic) may count as "other".
        meta["other_cpu_s"] = round(max(0.0, (busy1[0] - busy0[0]) - (busy1[1] - busy0[1])), 1)
    with open(os.path.join(out_dir, "samples.json"), "w") as f:
        json.dump({"meta": meta, "samples": b.samples}, f, indent=1)
    report(b.samples, out_dir, meta)
    for png in plots(b.samples, out_dir):
        log(f"plot: {png}")
    log(f"samples: {os.path.join(out_dir, 'samples.json')}; took {meta['seconds']} s")
    if interrupted:
        sys.exit(interrupted)


if __name__ == "__main__":
    main()
