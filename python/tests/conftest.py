"""Fixtures shared by the ferry Python tests: real processes on real loopback sockets.

Every wait has a deadline: futures are waited with result(timeout=...), child processes
through Child (reads with select, waits with timeouts, kills at teardown).
"""

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

HELPER = os.path.join(os.path.dirname(__file__), "ferry_helper.py")


def time_scale():
    """How much longer than on a quiet machine the tests' windows are (tests/test_util.h's
    time_scale(): FERRY_TEST_TIME_SCALE if set, else x3 in the soft-RoCE guest (FERRY_VM), times
    the load per core when above 1): a busy or emulated machine is slow, not broken."""
    try:
        scale = float(os.environ.get("FERRY_TEST_TIME_SCALE", "") or 0)
    except ValueError:
        scale = 0
    if scale >= 1:
        return scale
    scale = 3.0 if os.environ.get("FERRY_VM") else 1.0
    return scale * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


DEADLINE = 60.0 * time_scale()  # seconds any single wait in these tests may take at most

# Where the tests' contexts listen, and the transport their connections ask for: loopback and
# TCP by default; in the soft-RoCE guest (FERRY_TEST_TRANSPORT=RDMA: the rdma.python_tests
# test) the rxe address the guest exports and RDMA. Put in the environment, so that child
# processes (helpers, spawned ranks) and ferry's own default (FERRY_TRANSPORT) follow.
RDMA = os.environ.get("FERRY_TEST_TRANSPORT", "").upper() == "RDMA"
if RDMA:
    os.environ.setdefault("FERRY_TEST_HOST", os.environ.get("FERRY_RDMA_PEER_IP", ""))
    os.environ["FERRY_TRANSPORT"] = "rdma"
HOST = os.environ.get("FERRY_TEST_HOST") or ("" if RDMA else "127.0.0.1")
os.environ["FERRY_TEST_HOST"] = HOST
if HOST:
    os.environ["FERRY_RDT_HOST"] = HOST  # where ferry.rdt's per-process context listens


def pytest_collection_modifyitems(config, items):
    if RDMA and not HOST:
        skip = pytest.mark.skip(reason="SKIPPED: RDMA tests run inside the soft-RoCE guest "
                                       "(FERRY_RDMA_PEER_IP is not set here)")
        for item in items:
            item.add_marker(skip)


def have_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class Child:
    """A Python child process with line-based stdin/stdout and bounded waits."""

    def __init__(self, *args, script=HELPER, code=None):
        argv = [sys.executable, "-c", code] if code is not None else [sys.executable, script]
        self.proc = subprocess.Popen(argv + [str(a) for a in args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0)
        self._buffer = b""

    @property
    def pid(self):
        return self.proc.pid

    def send(self, line):
        self.proc.stdin.write(line.encode() if isinstance(line, str) else line)
        self.proc.stdin.flush()

    def read_line(self, timeout=DEADLINE):
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise AssertionError(f"child {self.pid}: no output within {timeout} s"
                                         f"{self._stderr_tail()}")
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    raise AssertionError(f"child {self.pid} exited (rc {self.proc.wait(5)})"
                                         f"{self._stderr_tail()}")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def wait(self, timeout=DEADLINE):
        """The exit code; AssertionError (and the child killed) if it has not exited in time."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"child {self.pid} still running after {timeout} s") from None

    def rest(self):
        """Everything the child wrote after the lines read so far (call once it has exited)."""
        rest, self._buffer = self._buffer + self.proc.stdout.read(), b""
        return rest.decode(errors="replace")

    def stderr(self):
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")

    def _stderr_tail(self):
        if self.proc.poll() is None:
            return ""
        return "\n--- child stderr ---\n" + self.stderr()[-3000:]

    def signal(self, sig):
        if self.proc.poll() is None:
            os.kill(self.pid, sig)
            if sig == signal.SIGSTOP:  # returns once every thread of it has stopped
                deadline = time.monotonic() + DEADLINE
                while self._state() not in ("T", "", "Z"):
                    assert time.monotonic() < deadline, f"child {self.pid} did not stop"
                    time.sleep(0.001)

    def _state(self):
        """"T" once every thread is stopped, "" once gone, else some thread's state."""
        try:
            states = set()
            for task in os.listdir(f"/proc/{self.pid}/task"):
                with open(f"/proc/{self.pid}/task/{task}/stat") as f:
                    states.add(f.read().rpartition(")")[2].split()[0])
        except OSError:
            return ""
        return "T" if states <= {"T", "t"} else min(states - {"T", "t"})

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a stopped process too
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            try:
                self.proc.stdin.close()  # EOF: helpers exit on their own
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for f in (self.proc.stdout, self.proc.stderr):
            f.close()


@contextlib.contextmanager
def children():
    """Factory: start(*args, code=...) starts a Child; all are closed when the block ends."""
    started = []

    def start(*args, **kwargs):
        started.append(Child(*args, **kwargs))
        return started[-1]

    try:
        yield start
    finally:
        for c in started:
            c.close()


@pytest.fixture
def child():
    """children() for one test: its Child processes are killed at its teardown."""
    with children() as start:
        yield start


class Owner:
    """A helper process owning objects(with_torch): .refs {name: ref}, .pid, .child."""

    def __init__(self, start):
        from ferry_helper import decode

        self.child = start("own", *(["--torch"] if have_torch() else []))
        info = decode(self.child.read_line())
        self.pid = info["pid"]
        self.refs = info["refs"]


@pytest.fixture
def owner(child):
    """An Owner of this test's own: it may stop, kill or outlive it."""
    return Owner(child)


@pytest.fixture(scope="module")
def shared_owner():
    """One Owner for a whole file whose tests only fetch from it (none stops or kills it): a
    helper that imports torch takes seconds to start, and over half a minute under the
    soft-RoCE guest's emulation."""
    with children() as start:
        yield Owner(start)


@pytest.fixture
def ctx():
    import ferry

    with ferry.Context(name="test") as c:
        yield c


@pytest.fixture
def local_owner():
    """An owning Context in this process (for tests about this process's own puts)."""
    import ferry

    with ferry.Context(f"{HOST}:0", name="test-owner") as c:
        yield c
