"""Two processes: the owner puts a numpy array and a torch tensor, the other fetches them.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/two_process_fetch.py

The ref crosses between the processes pickled (here through a multiprocessing pipe; in real
use, any channel: a Ray object, an HTTP body, a file). Exits 0 when every byte arrived.
"""

import multiprocessing as mp

import numpy as np


def owner(conn):
    import ferry
    with ferry.Context(listen="127.0.0.1:0", name="owner") as ctx:
        weights = np.arange(1 << 20, dtype=np.float32)         # 4 MiB, served zero copy
        ref = ctx.put(weights)
        conn.send(ref)                                         # pickles to ~150 bytes
        conn.recv()                                            # wait until the reader is done


def main():
    import ferry
    mp.set_start_method("spawn")
    here, there = mp.Pipe()
    child = mp.Process(target=owner, args=(there,))
    child.start()
    try:
        ref = here.recv() if here.poll(30) else None
        assert ref is not None, "the owner did not start"
        with ferry.Context(name="reader") as ctx:
            peer = ctx.connect(ref)                            # the ref names its owner
            got = peer.fetch(ref).result(timeout=30)           # a numpy array, like the one put
            into = np.empty(1 << 20, dtype=np.float32)
            peer.fetch(ref, into=into).result(timeout=30)      # straight into our own buffer
        expected = np.arange(1 << 20, dtype=np.float32)
        assert np.array_equal(got, expected) and np.array_equal(into, expected)
        print(f"fetched {got.nbytes} bytes twice over {peer.transport}: every byte right")
    finally:
        here.send("done")
        child.join(30)
        if child.is_alive():
            child.kill()


if __name__ == "__main__":
    main()
