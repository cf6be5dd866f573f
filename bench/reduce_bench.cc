#include "bench/reduce_bench.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/measure.h"
#include "ferry/collective/reduce.h"
#include "ferry/store/tensor.h"

namespace ferry::bench {
int run_reduce(uint64_t size, double seconds) {
  std::vector<std::byte> acc(size), in(size), elsewhere(size);
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kFloat16,
                  DType::kBFloat16}) {
    const size_t esize = dtype_size(t);
    const size_t bytes = size / esize * esize;
    // Zeros: every sum stays zero, so no value turns into an infinity or a subnormal on the way.
    std::memset(acc.data(), 0, size);
    std::memset(in.data(), 0, size);
    const std::span<std::byte> a(acc.data(), bytes), b(in.data(), bytes),
        c(elsewhere.data(), bytes);
    // Where the result goes: the first operand (reduce_into), the second, or a third buffer.
    const std::pair<const char*, std::span<std::byte>> places[] = {{"a", a}, {"b", b}, {"c", c}};
    for (auto op : {collective::ReduceOp::kSum, collective::ReduceOp::kMax}) {
      for (const auto& [into, out] : places) {
        const Repeated r =
            repeat_for(seconds, [&, out = out] { (void)collective::reduce_to(t, op, out, a, b); });
        JsonLine line;
        line.add("tool", "ferry-reduce")
            .add("dtype", std::string(dtype_name(t)))
            .add("op", std::string(collective::reduce_op_name(op)))
            .add("into", into)
            .add("size", static_cast<uint64_t>(bytes))
            .add("gbps", r.rate(bytes) / 1e9);
        std::printf("%s\n", line.str().c_str());
      }
    }
  }
  const Repeated r = repeat_for(seconds, [&] { std::memcpy(acc.data(), in.data(), size); });
  const double bps = r.rate(size);
  JsonLine out;
  out.add("tool", "memcpy").add("size", size).add("gbps", bps / 1e9);
  std::printf("%s\n", out.str().c_str());
  return 0;
}

}  // namespace ferry::bench
