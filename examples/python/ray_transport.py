"""ferry as a Ray Direct Transport tensor transport: one actor returns tensors, another reads
them straight from its memory.

    PYTHONPATH=build/python python3 examples/python/ray_transport.py

Needs Ray (`pip install ray`; Debian does not package it). Without Ray it says so and exits 77.
"""

import sys


def main():
    try:
        import ray
        from ray.experimental import register_tensor_transport
    except ImportError:
        print("SKIPPED: Ray is not installed (pip install ray); ferry.rdt's own tests play "
              "Ray's part instead (python/tests/test_rdt.py)")
        return 77
    import torch
    from ferry.rdt import FerryTensorTransport

    ray.init(num_cpus=2)
    register_tensor_transport("FERRY", ["cpu"], FerryTensorTransport, torch.Tensor)

    @ray.remote
    class Producer:
        @ray.method(tensor_transport="FERRY")
        def weights(self):
            return torch.arange(1 << 20, dtype=torch.float32)

    @ray.remote
    class Consumer:
        def total(self, weights):
            return float(weights.sum())

    producer, consumer = Producer.remote(), Consumer.remote()
    total = ray.get(consumer.total.remote(producer.weights.remote()), timeout=60)
    assert total == float(torch.arange(1 << 20, dtype=torch.float32).sum())
    print(f"the consumer read the producer's tensor over ferry: sum {total}")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
