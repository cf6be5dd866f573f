"""A Ray actor process as Ray Direct Transport uses one, for tests/test_rdt.py.

Reads one command per line on stdin (base64 of a pickled tuple), runs it against a
FerryTensorTransport made with no arguments (as Ray makes one in each process), and answers one
line (base64 of a pickled ("ok", value) or ("error", exception)). Exits at EOF.

Commands, by the part Ray's diagrams give each process:
  ("extract", obj_id, kind, seed, shapes)  source: make tensors (numpy or torch), extract
                                            metadata; answers the metadata (pickled)
  ("gc", obj_id, metadata)                 source: garbage_collect
  ("mutate", obj_id)                       source: changes the first element of the first
                                            tensor in place (after extract: the bytes served)
  ("setenv", name, value)                  sets an environment variable (FERRY_RDT_*)
  ("abort", obj_id)                        either side: abort_transport
  ("serving",)                             serves in flight now (ferry's stats)
  ("fetch", obj_id, metadata, targets)     destination: fetch_multiple_tensors (targets: None or
                                            a list of (kind, dtype, shape) to allocate); answers
                                            "started"; the fetch is kept under obj_id
  ("wait", obj_id, timeout)                destination: wait_fetch_complete; answers the digest
                                            of every tensor and whether the targets were used
  ("recv", obj_id, metadata, targets)      destination: recv_multiple_tensors; answers digests
  ("has_ferry",)                           actor_has_tensor_transport's probe
  ("transport", obj_id)                     destination: the transport its last wait's fetch used
  ("stats",)                                (RSS bytes, open fds, fetches the transport tracks)
"""

import base64
import hashlib
import os
import pickle
import sys


def encode(value):
    return base64.b64encode(pickle.dumps(value)).decode()


def decode(line):
    return pickle.loads(base64.b64decode(line))


def make_tensors(kind, seed, shapes):
    import numpy as np
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    if kind == "torch":
        import torch
        return [torch.from_numpy(a).to(torch.bfloat16) for a in arrays]
    return arrays


def digest(tensor):
    import numpy as np
    if hasattr(tensor, "numpy") and hasattr(tensor, "dtype") and "torch" in type(tensor).__module__:
        import torch
        raw = tensor.contiguous().view(torch.uint8).numpy() if tensor.numel() else np.zeros(0)
        return (str(tensor.dtype), tuple(tensor.shape), hashlib.sha256(raw.tobytes()).hexdigest())
    return (str(tensor.dtype), tuple(tensor.shape), hashlib.sha256(tensor.tobytes()).hexdigest())


def allocate(targets):
    if targets is None:
        return None
    import numpy as np
    out = []
    for kind, dtype, shape in targets:
        if kind == "torch":
            import torch
            out.append(torch.zeros(shape, dtype=getattr(torch, dtype)))
        else:
            out.append(np.zeros(shape, dtype=dtype))
    return out


def main():
    from ferry.rdt import FerryTensorTransport
    transport = FerryTensorTransport()
    kept = {}      # obj_id -> tensors put (the actor's return value: Ray keeps it alive)
    fetches = {}   # obj_id -> (FetchRequest, targets)
    fetched_over = {}  # obj_id -> the transport its last waited fetch used
    for line in sys.stdin:
        cmd = decode(line)
        try:
            op = cmd[0]
            if op == "extract":
                _, obj_id, kind, seed, shapes = cmd
                tensors = make_tensors(kind, seed, shapes)
                kept[obj_id] = tensors
                meta = transport.extract_tensor_transport_metadata(obj_id, tensors)
                value = (meta, [digest(t) for t in tensors])
            elif op == "gc":
                _, obj_id, meta = cmd
                transport.garbage_collect(obj_id, meta, kept.pop(obj_id, []))
                value = None
            elif op == "mutate":
                first = kept[cmd[1]][0]
                flat = first.view(-1) if "torch" in type(first).__module__ else first.reshape(-1)
                flat[0] += 1  # a view: the tensor itself changes
                value = None
            elif op == "setenv":
                os.environ[cmd[1]] = cmd[2]
                value = None
            elif op == "abort":
                transport.abort_transport(cmd[1], transport.get_communicator_metadata(None, None))
                value = None
            elif op == "fetch":
                _, obj_id, meta, targets = cmd
                buffers = allocate(targets)
                comm = transport.get_communicator_metadata(None, None, "FERRY")
                fetches[obj_id] = (transport.fetch_multiple_tensors(obj_id, meta, comm, buffers),
                                   buffers)
                value = "started"
            elif op == "wait":
                _, obj_id, timeout = cmd
                request, buffers = fetches[obj_id]
                tensors = transport.wait_fetch_complete(request, timeout)
                del fetches[obj_id]
                fetched_over[obj_id] = request.future.transport
                used = buffers is not None and all(t is b for t, b in zip(tensors, buffers))
                value = ([digest(t) for t in tensors], used)
            elif op == "recv":
                _, obj_id, meta, targets = cmd
                buffers = allocate(targets)
                comm = transport.get_communicator_metadata(None, None, "FERRY")
                tensors = transport.recv_multiple_tensors(obj_id, meta, comm, buffers)
                value = ([digest(t) for t in tensors], buffers is not None)
            elif op == "serving":
                from ferry import rdt
                value = rdt._process.context.stats()["serves_in_flight"]
            elif op == "transport":
                value = fetched_over.get(cmd[1])
            elif op == "has_ferry":
                value = True
            elif op == "stats":
                from ferry import rdt
                with open("/proc/self/statm") as f:
                    rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
                value = (rss, len(os.listdir("/proc/self/fd")), len(rdt._process.fetches))
            else:
                raise ValueError(f"unknown command {op!r}")
            reply = ("ok", value)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the test
            reply = ("error", e)
        try:
            sys.stdout.write(encode(reply) + "\n")
        except Exception as e:  # an exception that does not pickle: its text
            sys.stdout.write(encode(("error", RuntimeError(f"{type(e).__name__}: {e}"))) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
