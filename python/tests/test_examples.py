"""The examples in examples/python run, each as its own process, and succeed."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("ferry", reason="ferry is not built (PYTHONPATH=build/python)")

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python")


def run(name):
    # The examples listen on loopback, as a user running them first would: over TCP, also when
    # the suite runs over RDMA (conftest's FERRY_TRANSPORT would refuse loopback there).
    env = {k: v for k, v in os.environ.items() if k != "FERRY_TRANSPORT"}
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("name", ["two_process_fetch.py", "asyncio_fetch.py"])
def test_example_runs(name):
    r = run(name)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every byte right" in r.stdout


def test_ray_example():
    r = run("ray_transport.py")
    if r.returncode == 77:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stdout + r.stderr
