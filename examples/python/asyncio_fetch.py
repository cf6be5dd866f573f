"""An asyncio fetcher: many fetches in flight, awaited without blocking the event loop.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/asyncio_fetch.py

ferry's futures are awaitable: the completion reaches the loop through call_soon_threadsafe,
with no polling and no thread per fetch.
"""

import asyncio

import numpy as np


async def main():
    import ferry
    with ferry.Context(listen="127.0.0.1:0", name="owner") as owner, \
            ferry.Context(name="reader") as reader:
        arrays = [np.full(256 << 10, i, dtype=np.uint8) for i in range(32)]
        refs = [owner.put(a) for a in arrays]
        peer = reader.connect(owner.address)
        ticks = 0

        async def heartbeat():  # the loop stays free while the fetches are in flight
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beat = asyncio.ensure_future(heartbeat())
        results = await asyncio.wait_for(asyncio.gather(*(peer.fetch(r) for r in refs)), 30)
        beat.cancel()
        assert all(np.array_equal(r, a) for r, a in zip(results, arrays))
        print(f"{len(results)} fetches awaited together, every byte right; the loop ran "
              f"{ticks} other steps meanwhile")


if __name__ == "__main__":
    asyncio.run(main())
