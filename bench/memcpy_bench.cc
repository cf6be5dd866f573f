#include "bench/memcpy_bench.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "bench/measure.h"

namespace ferry::bench {

int run_memcpy(uint64_t size, double seconds) {
  std::unique_ptr<std::byte[]> a(new std::byte[size]);
  std::unique_ptr<std::byte[]> b(new std::byte[size]);
  std::memset(a.get(), 1, size);
  std::memset(b.get(), 2, size);
  bool back = false;  // the copies go a -> b and b -> a in turn
  const Repeated r = repeat_for(seconds, [&] {
    std::memcpy(back ? a.get() : b.get(), back ? b.get() : a.get(), size);
    back = !back;
  });
  JsonLine out;
  out.add("tool", "memcpy")
      .add("size", size)
      .add("copies", r.times)
      .add("gbps", r.rate(size) / 1e9);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

}  // namespace ferry::bench
