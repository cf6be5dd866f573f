"""One congestion control for every loopback TCP connection of a bench run.

ferry's data channels within one host use ONE_HOST_CONGESTION (ferry/tcp/congestion.h) and iperf3 is
given it with -C, but Open MPI, Gloo, UCX, qperf and sockperf cannot be told one per connection:
they take the system's default. A route's `congctl` is applied to both ends of a connection when
it starts, over the default and over a TCP_CONGESTION set before connect, so setting it on the
/32 entry for 127.0.0.1 in table local (the entry connections to 127.0.0.1 take, not the
127.0.0.0/8 one) puts every tool of the run on the same algorithm without touching the sysctl.
The route is restored when the block ends (normally, by an exception, SIGINT or SIGTERM); a
SIGKILL leaves it set, so the restore command is logged first. Where the route cannot be set
(no `ip` command, as for a bench bundle on a bare machine, or no such route) the system default is set for the run through
/proc/sys/net/ipv4/tcp_congestion_control, and restored the same way; the report says which.
"""

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess

TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)


@functools.lru_cache(maxsize=None)
def system_congestion():
    """The system's default TCP congestion control ("" if unknown)."""
    try:
        return open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    except OSError:
        return ""


def mixed(algo, system):
    """The report's line when only ferry and iperf3 could be put on `algo`."""
    return (f"ferry's loopback data channels and iperf3 -C: {algo}; Open MPI, Gloo, UCX, qperf, "
            f"sockperf: {system}")


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def _local_route():
    """The table-local route for 127.0.0.1 as `ip route show` prints it, or "" if none."""
    r = _ip("route", "show", "table", "local", "127.0.0.1")
    lines = [l.strip() for l in r.stdout.splitlines() if l.strip().startswith("local 127.0.0.1 ")]
    return lines[0] if r.returncode == 0 and len(lines) == 1 else ""


def _without_congctl(route):
    words = route.split()
    keep, i = [], 0
    while i < len(words):
        if words[i] == "congctl":
            i += 2 if i + 1 < len(words) and words[i + 1] != "lock" else 3
            continue
        keep.append(words[i])
        i += 1
    return keep


SYSCTL = "/proc/sys/net/ipv4/tcp_congestion_control"


@contextlib.contextmanager
def _system_default(algo, system, why, log):
    """Sets the system's default congestion control to `algo` for the block (root, where the
    route cannot be set: `why`)."""
    try:
        with open(SYSCTL, "w") as f:
            f.write(algo)
    except OSError as e:
        yield f"{mixed(algo, system)} ({why}, and {SYSCTL} could not be set: {e})"
        return
    log(f"every connection on {algo}: the sysctl net.ipv4.tcp_congestion_control, set for this "
        f"run ({why}); if this run is killed, restore with: echo {system} > {SYSCTL}")
    previous = signal.getsignal(signal.SIGTERM)

    def terminated(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        seen = loopback_connection_congestion()
        if seen != (algo, algo):
            yield f"{mixed(algo, system)} (the sysctl was set to {algo} but connections got {seen})"
        else:
            yield (f"every tool: {algo} (the sysctl net.ipv4.tcp_congestion_control set for the "
                   f"run: {why}; the system's default {system} restored after)")
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            with open(SYSCTL, "w") as f:
                f.write(system)
        except OSError as e:
            log(f"WARNING: {SYSCTL} was not restored to {system}: {e}")


def loopback_connection_congestion():
    """(client's, server's) congestion control of a fresh connection to 127.0.0.1."""
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        lst.settimeout(5)
        with socket.create_connection(lst.getsockname(), timeout=5) as c:
            s, _ = lst.accept()
            with s:
                read = lambda k: k.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
                return tuple(read(k).split(b"\0", 1)[0].decode() for k in (c, s))


@contextlib.contextmanager
def same_loopback_congestion(algo, log):
    """Within the block every new TCP connection to 127.0.0.1 uses `algo` at both ends, if this
    process may change routes. Yields one line for the report saying what holds."""
    system = system_congestion()
    if system == algo:
        yield f"every tool: {algo} (the system's default)"
        return
    why = ("not root" if os.geteuid() != 0 else "no ip command" if not shutil.which("ip")
           else "")
    original = "" if why else _local_route()
    if not why and not original:
        why = "no table-local route for 127.0.0.1"
    if why and os.geteuid() == 0:
        with _system_default(algo, system, why, log) as line:
            yield line
        return
    if why:
        yield f"{mixed(algo, system)} (the route could not be set: {why})"
        return
    restore = ["route", "replace"] + original.split() + ["table", "local"]
    log(f"every loopback connection on {algo} (route congctl); if this run is killed, restore "
        f"with: ip {' '.join(restore)}")
    r = _ip("route", "replace", *_without_congctl(original), "table", "local", "congctl", algo)
    previous = signal.getsignal(signal.SIGTERM)

    def terminated(signum, frame):
        raise SystemExit(128 + signum)  # unwinds through the finally below

    signal.signal(signal.SIGTERM, terminated)
    try:
        seen = loopback_connection_congestion() if r.returncode == 0 else None
        if seen != (algo, algo):
            yield (f"{mixed(algo, system)} (route congctl {algo} did not take: "
                   f"{r.stderr.strip() or seen})")
        else:
            yield f"every tool's loopback connections: {algo} (route congctl; system default {system})"
    finally:
        back = _ip(*restore)
        signal.signal(signal.SIGTERM, previous)
        if back.returncode != 0 or _local_route() != original:
            log(f"WARNING: the route for 127.0.0.1 was not restored ({back.stderr.strip()}); "
                f"run: ip {' '.join(restore)}")
