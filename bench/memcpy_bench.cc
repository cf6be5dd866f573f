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
  uint64_t copies = 0;
  const Repeated r = repeat_for(seconds, [&] {
    std::memcpy(copies % 2 ? a.get() : b.get(), copies % 2 ? b.get() : a.get(), size);
    ++copies;
  });
  JsonLine out;
  out.add("tool", "memcpy")
      .add("size", size)
      .add("copies", copies)
      .add("gbps", static_cast<double>(copies * size) / r.seconds / 1e9);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

}  // namespace ferry::bench
