#!/usr/bin/env python3
"""ferry from Python beside what a Python (Ray) user has without it: one object of SIZE bytes
moved between two processes on loopback, again and again, for SECONDS.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py TOOL --size N
        [--inflight K] [--seconds S] [--warmup W] [--into]

Tools (each prints one JSON line, as `ferry-bench fetch` does: tool, size, inflight, gbps,
fetches_per_s, p50_us, p99_us, cpu_s_per_gb, ...):

  ferry-py       an owner process (this script, spawned) puts one numpy uint8 array and hands
                 over the pickled ObjectRef; this process keeps K fetches in flight, each reissued
                 from its done-callback (ferry's completion thread), into K preallocated numpy
                 buffers (--into; tool "ferry") or into memory ferry allocates ("ferry-py-alloc");
                 with --wait ("ferry-wait") the main thread instead issues and waits in
                 result() for the oldest, as code that fetches one at a time does
  shm-pickle     the way of Ray's custom-transport example: per transfer the source pickles the
                 array (protocol 5) into a new multiprocessing.shared_memory segment and answers
                 with its name; this process opens it, unpickles (a copy into a new array),
                 closes it and tells the source to unlink it. Requests and answers cross the
                 source's stdin/stdout pipes; K requests outstanding
  torch-gloo     torch.distributed, gloo backend, two ranks (file:// store). bandwidth (K > 1):
                 rank 0 isends, this process (rank 1) irecvs into K preallocated tensors, K
                 outstanding, no requests (gloo's best case); latency (K = 1): fetch-shaped, a
                 1-element request tensor to rank 0, then the SIZE-byte answer
  pickle-socket  a TCP server that, per 1-byte request, pickles the array (protocol 5) and sends
                 it length-prefixed (TCP_NODELAY); this process receives into a bytearray and
                 unpickles it; K requests outstanding

Each tool first makes one untimed transfer, then warms up. Each transfer is timed from issue
(the fetch or request) to completion (the callback, the unpickled array, the finished irecv).
Bandwidth credits each transfer with the share of its span inside the measured window (as
ferry-bench does; torch-gloo's window is instead a count of transfers both ranks agree on after a
calibration phase); percentiles are over the transfers issued and completed inside it (transfers
slower than the window: those completed in it, else those overlapping it: "latency_of" says).
Every line also has both processes' CPU seconds and page faults per transfer; ferry-py adds
where a fetch's time goes (ferry's own span of it, Python's beyond it, the issuing call) and,
with --from HOST:PORT, fetches from a `ferry-bench serve` instead of a Python owner. Exit status
77 with {"skipped": reason} when a tool cannot run here (ferry or torch's Gloo missing).
"""

import argparse
import collections
import json
import os
import pickle
import resource
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)
SKIP = 77
# Bounds on every wait: a peer that stalls ends the run with an error, never hangs it.
START_TIMEOUT = 60.0
IO_TIMEOUT = 30.0
now = time.perf_counter


class Skip(Exception):
    pass


def fail(msg):
    print(f"python_bench: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def proc_stat(pid):
    """(CPU seconds, minor page faults) of process `pid` so far; (-1, -1) if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])
    except (OSError, IndexError, ValueError):
        return -1.0, -1


class Meter:
    """CPU seconds and minor page faults of this process and the server over a stretch."""

    def __init__(self, server_pid):
        self.server_pid = server_pid
        self.c0 = self._self()
        self.s0 = proc_stat(server_pid) if server_pid else (-1.0, -1)

    @staticmethod
    def _self():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime, r.ru_minflt

    def stop(self):
        c1 = self._self()
        s1 = proc_stat(self.server_pid) if self.server_pid else (-1.0, -1)
        ok = self.s0[0] >= 0 and s1[0] >= 0
        self.cpu_client = c1[0] - self.c0[0]
        self.cpu_server = s1[0] - self.s0[0] if ok else -1.0
        self.faults_client = c1[1] - self.c0[1]
        self.faults_server = s1[1] - self.s0[1] if ok else -1
        return self


def quantile(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


class Recorder:
    """Spans (issue, completion) of transfers; the measured window [t0, t1]."""

    def __init__(self):
        self.t0 = self.t1 = None
        self.spans = []
        self.lock = threading.Lock()

    def add(self, started, done):
        with self.lock:
            if self.t0 is not None and done > self.t0:
                self.spans.append((started, done))

    def result(self, size):
        fetches = 0.0
        lat = []
        for a, b in self.spans:
            lo, hi = max(a, self.t0), min(b, self.t1)
            if hi > lo:
                fetches += (hi - lo) / (b - a) if b > a else 1.0
            if a >= self.t0 and b <= self.t1:
                lat.append((b - a) * 1e6)
        latency_of = "issued and completed in the window"
        if not lat:  # transfers slower than the window (64 MiB pickled on a VM): those that
            # completed in it
            latency_of = "completed in the window"
            lat = [(b - a) * 1e6 for a, b in self.spans if self.t0 < b <= self.t1]
        if not lat:
            latency_of = "overlapping the window"
            lat = [(b - a) * 1e6 for a, b in self.spans if a < self.t1]
        secs = self.t1 - self.t0
        return {"fetches": fetches, "seconds": secs, "gbps": fetches * size / secs / 1e9,
                "fetches_per_s": fetches / secs, "p50_us": quantile(lat, 0.5),
                "p99_us": quantile(lat, 0.99), "latencies": len(lat), "latency_of": latency_of}


class Child:
    """This script in another process (`sub` subcommand), stdin/stdout pipes, a deadline."""

    def __init__(self, sub, argv, env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen([sys.executable, HERE, sub] + argv, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
                                  bufsize=0)

    def readline(self, timeout):
        """One line of its stdout (bytes, without the newline) within `timeout` seconds."""
        deadline = now() + timeout
        out = b""
        fd = self.p.stdout.fileno()
        while not out.endswith(b"\n"):
            left = deadline - now()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"{self.p.args[2]}: no answer within {timeout:.0f} s")
            chunk = os.read(fd, 1)
            if not chunk:
                err = self.p.stderr.read().decode(errors="replace")[-800:] if \
                    self.p.poll() is not None else ""
                raise RuntimeError(f"{self.p.args[2]} exited ({self.p.poll()}): {err}")
            out += chunk
        return out[:-1]

    def ready(self):
        line = self.readline(START_TIMEOUT)
        if line.startswith(b"skip "):
            raise Skip(line[5:].decode())
        if not line.startswith(b"ready"):
            raise RuntimeError(f"{self.p.args[2]} did not start: {line!r}")
        return line[6:]

    def send(self, data):
        self.p.stdin.write(data)

    def stop(self, timeout=10):
        try:  # communicate() closes its stdin first: EOF is the child's cue to finish
            _, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            _, err = self.p.communicate(timeout=10)
        return self.p.returncode, err.decode(errors="replace")


def wait_for_eof(limit):
    """A child's main loop when it only serves: until its stdin closes (or `limit` seconds)."""
    deadline = now() + limit
    fd = sys.stdin.fileno()
    while now() < deadline:
        if select.select([fd], [], [], min(1.0, max(0.0, deadline - now())))[0]:
            if not os.read(fd, 4096):
                return


def make_array(size):
    import numpy as np
    a = np.empty(size, dtype=np.uint8)
    a.fill((size & 0xFF) | 1)  # touched, not zero (as ferry-bench serve's objects)
    return a


def touched_buffer(size):
    import numpy as np
    b = np.empty(size, dtype=np.uint8)
    b.fill(0)  # faulted in before the clock starts (ferry-bench does the same)
    return b


def report(tool, args, rec, extra, meter):
    r = rec.result(args.size)
    out = {"tool": tool, "size": args.size, "inflight": args.inflight}
    out.update(r)
    out.update(extra)
    out["cpu_client_s"] = meter.cpu_client
    out["cpu_server_s"] = meter.cpu_server
    moved = r["fetches"] * args.size
    if moved > 0 and meter.cpu_server >= 0:
        out["cpu_s_per_gb"] = (meter.cpu_client + meter.cpu_server) / (moved / 1e9)
    # Page faults per transfer (both processes, over the window): fresh memory per transfer is
    # what the pickling peers pay for, and on a VM each fault can cost tens of microseconds.
    if r["fetches"] > 0 and meter.faults_server >= 0:
        out["faults_per_transfer"] = (meter.faults_client + meter.faults_server) / r["fetches"]
    print(json.dumps(out), flush=True)


def measure(args, rec, server_pid):
    """Warm-up, then the window [t0, t1]; returns the Meter of the window."""
    time.sleep(args.warmup)
    meter = Meter(server_pid)
    with rec.lock:
        rec.t0 = now()
    time.sleep(args.seconds)
    with rec.lock:
        rec.t1 = now()
    return meter.stop()


def pipelined(args, issue, complete, rec):
    """K requests outstanding on one channel, answered in order: issue() sends one, complete()
    blocks (bounded) until the oldest is done; each completion issues the next until the window
    [warm-up end, + seconds] is over, then the rest drain. Returns the window's Meter (taken by
    timers at the window's edges, since complete() may block across them)."""
    issue()  # primed, untimed: the first transfer pays for set-up (a resource tracker started)
    complete()
    pending = collections.deque()
    rec.t0 = now() + args.warmup
    rec.t1 = rec.t0 + args.seconds
    meter = []
    timers = [threading.Timer(rec.t0 - now(), lambda: meter.append(Meter(args.server_pid))),
              threading.Timer(rec.t1 - now(), lambda: meter[0].stop())]
    for t in timers:
        t.start()
    try:
        for _ in range(args.inflight):
            pending.append(now())
            issue()
        while pending:
            complete()
            done = now()
            rec.add(pending.popleft(), done)
            if done < rec.t1:
                pending.append(now())
                issue()
    except BaseException:
        for t in timers:
            t.cancel()
        raise
    for t in timers:  # the last completion may come a moment before the timer at t1 runs
        t.join(args.seconds + args.warmup + IO_TIMEOUT)
    if not meter or not hasattr(meter[0], "cpu_client"):
        raise RuntimeError("the window's meter did not run")
    return meter[0]


# ---------------------------------------------------------------- ferry

def ferry_owner(args):
    try:
        import ferry
    except ImportError as e:
        print(f"skip ferry does not import: {e}", flush=True)
        return
    with ferry.Context(listen="127.0.0.1:0", name="python-bench-owner") as ctx:
        ref = ctx.put(make_array(args.size))
        print(f"ready {pickle.dumps(ref).hex()}", flush=True)
        wait_for_eof(args.limit)


def run_ferry(args):
    try:
        import ferry
    except ImportError as e:
        raise Skip(f"ferry does not import (PYTHONPATH={os.environ.get('PYTHONPATH', '')}): {e}")
    owner = None if args.from_ else Child("_ferry-owner", ["--size", str(args.size)])
    try:
        ctx = ferry.Context(name="python-bench")
        if owner:
            ref = pickle.loads(bytes.fromhex(owner.ready().decode()))
            args.server_pid = owner.p.pid
            peer = ctx.connect(ref)
        else:  # a `ferry-bench serve` (C++): its object of this size, fetched as raw bytes
            peer = ctx.connect(args.from_)
            ref = next((r for r in peer.list(timeout=IO_TIMEOUT) if r.nbytes == args.size), None)
            if ref is None:
                raise RuntimeError(f"{args.from_} has no object of {args.size} bytes")
            args.server_pid = args.server_pid_arg
        peer.fetch(ref).result(IO_TIMEOUT)  # primed: connected, data channel open
        buffers = [touched_buffer(args.size) for _ in range(args.inflight)] if args.into else None
        rec = Recorder()
        state = {"stopping": False, "outstanding": args.inflight, "error": None,
                 "transport": None}
        drained = threading.Event()

        # Where a fetch's time goes: ferry's own span of it (Future.elapsed: from async_fetch to
        # the C++ completion handler, on the io thread) and the Python call that issued it.
        parts = []  # (issued, completed, ferry's span s, issue call s)

        if args.wait:  # the main thread issues, and waits in result() for the oldest
            pending = collections.deque()
            issued = [0]

            def issue():  # fetch i lands where fetch i - K did, which completed before it
                slot = issued[0] % args.inflight
                issued[0] += 1
                pending.append(peer.fetch(ref, into=buffers[slot] if buffers else None))

            def complete():
                f = pending.popleft()
                f.result(IO_TIMEOUT)
                state["transport"] = f.transport

            meter = pipelined(args, issue, complete, rec)
            tool = args.tool_name or ("ferry-wait" if args.into else "ferry-wait-alloc")
            report(tool, args, rec, dict(transport=state["transport"],
                                         ferry_allocates=0 if args.into else 1), meter)
            peer.close()
            ctx.close()
            return

        def launch(slot):
            issue = [now(), None]  # when, and how long the issuing calls took
            f = peer.fetch(ref, into=buffers[slot] if buffers else None)
            f.add_done_callback(lambda f: done(slot, issue, f))
            issue[1] = now() - issue[0]

        def done(slot, issue, f):
            t = now()
            started, issue_s = issue
            e = f.exception()
            if e is None:
                f.result()  # the result (into's buffer, or arrays viewing ferry's pool) dropped
                rec.add(started, t)
                parts.append((started, t, f.elapsed, issue_s))
                state["transport"] = f.transport
            elif state["error"] is None:
                state["error"] = e
            if e is not None or state["stopping"]:
                state["outstanding"] -= 1
                if state["outstanding"] == 0:
                    drained.set()
                return
            launch(slot)

        for slot in range(args.inflight):
            launch(slot)
        meter = measure(args, rec, args.server_pid)
        state["stopping"] = True  # read on the completion thread: a bool store is atomic
        if not drained.wait(IO_TIMEOUT):
            raise RuntimeError(f"fetches still in flight {IO_TIMEOUT:.0f} s after the window")
        if state["error"] is not None:
            raise RuntimeError(f"fetch failed: {state['error']!r}")
        inside = [p for p in parts if p[0] >= rec.t0 and p[1] <= rec.t1]
        where = {
            # ferry's own span of the fetch (C++: issue to its completion handler)
            "native_p50_us": quantile([p[2] * 1e6 for p in inside], 0.5),
            # Python's span minus ferry's: the issuing call's tail, the hand-over to the
            # completion thread, resolving the future, until the callback runs
            "python_extra_p50_us": quantile([((p[1] - p[0]) - p[2]) * 1e6 for p in inside], 0.5),
            # peer.fetch() + add_done_callback (the Python call that issues a fetch)
            "issue_call_p50_us": quantile([p[3] * 1e6 for p in inside if p[3] is not None], 0.5),
        }
        tool = args.tool_name or ("ferry" if args.into else "ferry-py-alloc")
        report(tool, args, rec, dict(where, transport=state["transport"],
                                     ferry_allocates=0 if args.into else 1,
                                     pool=ctx.pool_stats()), meter)
        peer.close()
        ctx.close()
    finally:
        rc, err = owner.stop() if owner else (0, "")
        if rc not in (0, None):
            print(f"python_bench: the owner exited {rc}: {err[-400:]}", file=sys.stderr)


# ---------------------------------------------------------------- shm-pickle

class _ShmWriter:
    """A file for pickle.Pickler that writes into shared memory: the array's bytes are copied
    once, straight from the array into the segment (protocol 5 writes large payloads to the file
    outside its frames)."""

    def __init__(self, mv):
        self.mv = mv
        self.pos = 0

    def write(self, b):
        m = b.raw() if isinstance(b, pickle.PickleBuffer) else memoryview(b).cast("B")
        n = m.nbytes
        self.mv[self.pos:self.pos + n] = m
        self.pos += n
        return n


def shm_source(args):
    from multiprocessing import shared_memory
    arr = make_array(args.size)
    segments = {}
    print("ready", flush=True)
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    seq = 0
    while True:
        line = inp.readline()  # the destination's requests, in order; EOF: the end
        if not line:
            break
        if line.startswith(b"F "):  # the destination is done with a segment (garbage_collect)
            shm = segments.pop(line[2:-1].decode())
            shm.close()
            shm.unlink()
            continue
        seq += 1
        shm = shared_memory.SharedMemory(create=True, size=args.size + 4096,
                                         name=f"pybench_{os.getpid()}_{seq}")
        w = _ShmWriter(shm.buf)
        pickle.Pickler(w, protocol=5).dump(arr)
        del w  # no view of shm.buf may outlive close()
        segments[shm.name] = shm
        out.write(f"{shm.name} {args.size + 4096}\n".encode())
        out.flush()
    for shm in segments.values():
        shm.close()
        shm.unlink()


def run_shm(args):
    from multiprocessing import resource_tracker, shared_memory
    src = Child("_shm-source", ["--size", str(args.size)])
    try:
        src.ready()
        args.server_pid = src.p.pid
        rec = Recorder()
        checked = [False]

        def issue():
            src.send(b"R\n")

        def complete():
            name, _ = src.readline(IO_TIMEOUT).decode().split()
            shm = shared_memory.SharedMemory(name=name)
            # Python 3.11 registers segments it merely opens with its resource tracker, which
            # would unlink them at exit: the source owns them.
            resource_tracker.unregister(shm._name, "shared_memory")
            mv = shm.buf
            got = pickle.loads(mv)  # a copy out of the segment into a new array
            mv.release()
            shm.close()
            src.send(f"F {name}\n".encode())
            if not checked[0]:
                if got.nbytes != args.size or got[0] != ((args.size & 0xFF) | 1):
                    raise RuntimeError("shm-pickle: wrong bytes")
                checked[0] = True

        meter = pipelined(args, issue, complete, rec)
        report("shm-pickle", args, rec, {}, meter)
    finally:
        rc, err = src.stop()
        if rc not in (0, None):
            print(f"python_bench: the shm source exited {rc}: {err[-400:]}", file=sys.stderr)


# ---------------------------------------------------------------- pickle-socket

def _recv_exact(sock, buf):
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = sock.recv_into(view[got:])
        if not n:
            raise RuntimeError("pickle-socket: the server closed the connection")
        got += n


def _send_all(sock, parts):
    """sendmsg of every part (no concatenation copy), resumed after partial sends."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        n = sock.sendmsg(views)
        while n:
            if n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0


def pickle_server(args):
    arr = make_array(args.size)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    ls.settimeout(START_TIMEOUT)
    print(f"ready {ls.getsockname()[1]}", flush=True)
    conn, _ = ls.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(args.limit)
    req = bytearray(1)
    while True:
        try:
            if conn.recv_into(req) == 0:
                break
        except (ConnectionError, socket.timeout):
            break
        data = pickle.dumps(arr, protocol=5)
        try:
            _send_all(conn, [struct.pack("<Q", len(data)), data])
        except (ConnectionError, socket.timeout):
            break
    conn.close()


def run_pickle_socket(args):
    srv = Child("_pickle-server", ["--size", str(args.size)])
    try:
        port = int(srv.ready())
        args.server_pid = srv.p.pid
        sock = socket.create_connection(("127.0.0.1", port), timeout=START_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(IO_TIMEOUT)
        rec = Recorder()
        head = bytearray(8)
        checked = [False]

        def issue():
            sock.sendall(b"R")

        def complete():
            _recv_exact(sock, head)
            buf = bytearray(struct.unpack("<Q", head)[0])
            _recv_exact(sock, buf)
            got = pickle.loads(buf)
            if not checked[0]:
                if got.nbytes != args.size or got[0] != ((args.size & 0xFF) | 1):
                    raise RuntimeError("pickle-socket: wrong bytes")
                checked[0] = True

        meter = pipelined(args, issue, complete, rec)
        report("pickle-socket", args, rec, {}, meter)
        sock.close()
    finally:
        rc, err = srv.stop()
        if rc not in (0, None):
            print(f"python_bench: the server exited {rc}: {err[-400:]}", file=sys.stderr)


# ---------------------------------------------------------------- torch-gloo

def _gloo_init(rank, store_path):
    import datetime
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        raise Skip("torch.distributed with the gloo backend is not available in this torch")
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=IO_TIMEOUT))
    return dist


def _gloo_wait(work):
    import datetime
    if not work.wait(datetime.timedelta(seconds=IO_TIMEOUT)):
        raise RuntimeError("torch-gloo: an operation did not complete in time")


def gloo_rank0(args):
    """The sender. Phases, as rank 1 drives them: `calib` transfers, then rank 1 sends how many
    the window needs (an int64), then that many. Latency mode: each answer follows a request."""
    import torch
    try:
        dist = _gloo_init(0, args.store)
    except Skip as e:
        print(f"skip {e}", flush=True)
        return
    print("ready", flush=True)
    src = torch.from_numpy(make_array(args.size))
    req = torch.zeros(1, dtype=torch.int64)

    def send_n(n):
        if args.inflight == 1:
            for _ in range(n):
                _gloo_wait(dist.irecv(req, src=1, tag=1))
                _gloo_wait(dist.isend(src, dst=1, tag=0))
            return
        pending = collections.deque()
        for _ in range(n):
            if len(pending) >= args.inflight:
                _gloo_wait(pending.popleft())
            pending.append(dist.isend(src, dst=1, tag=0))
        while pending:
            _gloo_wait(pending.popleft())

    count = torch.zeros(1, dtype=torch.int64)
    while True:
        _gloo_wait(dist.irecv(count, src=1, tag=2))
        if count.item() <= 0:
            break
        send_n(int(count.item()))
    dist.destroy_process_group()


def run_gloo(args):
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError as e:
        raise Skip(f"torch does not import: {e}")
    env = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    os.environ.update(env)
    tmp = tempfile.mkdtemp(prefix="pybench-gloo-")
    store = os.path.join(tmp, "store")
    r0 = Child("_gloo-rank0", ["--size", str(args.size), "--inflight", str(args.inflight),
                               "--store", store], env=env)
    try:
        dist = _gloo_init(1, store)
        r0.ready()
        args.server_pid = r0.p.pid
        bufs = [torch.from_numpy(touched_buffer(args.size)) for _ in range(args.inflight)]
        req = torch.ones(1, dtype=torch.int64)
        count = torch.zeros(1, dtype=torch.int64)
        rec = Recorder()

        def phase(n, record):
            """n transfers; each span from its irecv (latency: its request) to its completion."""
            count.fill_(n)
            _gloo_wait(dist.isend(count, dst=0, tag=2))
            pending = collections.deque()
            i = 0
            while i < n or pending:
                while i < n and len(pending) < args.inflight:
                    started = now()
                    if args.inflight == 1:
                        _gloo_wait(dist.isend(req, dst=0, tag=1))
                    pending.append((started, dist.irecv(bufs[i % args.inflight], src=0, tag=0)))
                    i += 1
                started, work = pending.popleft()
                _gloo_wait(work)
                record(started, now())

        # Calibration (also the warm-up): enough transfers for args.warmup at the rate seen.
        began = now()
        n = 4
        while True:
            t = now()
            phase(n, lambda a, b: None)
            last = now() - t
            if now() - began >= args.warmup or n >= 1 << 20:
                break
            n *= 2
        rate = n / max(last, 1e-6)  # transfers per second in the last calibration phase
        total = max(args.inflight * 2, int(rate * args.seconds))
        meter = Meter(r0.p.pid)
        rec.t0 = now()
        spans = []
        phase(total, lambda a, b: spans.append((a, b)))
        rec.t1 = now()
        meter.stop()
        rec.spans = spans
        if bufs[0][0].item() != ((args.size & 0xFF) | 1):
            raise RuntimeError("torch-gloo: wrong bytes")
        count.fill_(0)
        _gloo_wait(dist.isend(count, dst=0, tag=2))
        report("torch-gloo", args, rec, {"transfers": total,
                                         "mode": "request+answer" if args.inflight == 1
                                         else "push"}, meter)
        dist.destroy_process_group()
    finally:
        rc, err = r0.stop()
        if rc not in (0, None):
            print(f"python_bench: rank 0 exited {rc}: {err[-400:]}", file=sys.stderr)
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- main

TOOLS = {"ferry-py": run_ferry, "shm-pickle": run_shm, "torch-gloo": run_gloo,
         "pickle-socket": run_pickle_socket}
CHILDREN = {"_ferry-owner": ferry_owner, "_shm-source": shm_source, "_gloo-rank0": gloo_rank0,
            "_pickle-server": pickle_server}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tool", choices=sorted(TOOLS) + sorted(CHILDREN))
    ap.add_argument("--size", type=int, required=True, help="bytes per object")
    ap.add_argument("--inflight", type=int, default=1,
                    help="transfers outstanding (1: latency, each issued when the last ended)")
    ap.add_argument("--seconds", type=float, default=2.0, help="measured window")
    ap.add_argument("--warmup", type=float, default=0.3, help="before the window, not measured")
    ap.add_argument("--wait", action="store_true",
                    help="ferry-py: wait for each fetch in result() on the main thread instead "
                         "of reissuing from done-callbacks")
    ap.add_argument("--into", action="store_true",
                    help="ferry-py: fetch into preallocated numpy buffers (else ferry allocates)")
    ap.add_argument("--from", dest="from_", default=None, metavar="HOST:PORT",
                    help="ferry-py: fetch from this `ferry-bench serve` (C++) instead of a "
                         "Python owner (where the time goes: either side alone in Python)")
    ap.add_argument("--server-pid", dest="server_pid_arg", type=int, default=0,
                    help="with --from: the server's pid, for its CPU time")
    ap.add_argument("--tool-name", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=float, default=900, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.size < 1 or args.inflight < 1 or args.seconds <= 0:
        fail("--size, --inflight and --seconds must be positive")
    args.server_pid = 0
    if args.tool in CHILDREN:
        CHILDREN[args.tool](args)
        return
    try:
        TOOLS[args.tool](args)
    except Skip as e:
        print(json.dumps({"tool": args.tool, "skipped": str(e)}), flush=True)
        sys.exit(SKIP)


if __name__ == "__main__":
    main()
