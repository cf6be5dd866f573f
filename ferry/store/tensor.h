// Tensor descriptions: shapes, dtypes, devices, and views of the bytes behind them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// Element types. The numeric values travel on the wire; never renumber.
enum class DType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
};

// Size of one element in bytes; 0 for a value outside the enum.
size_t dtype_size(DType dtype);
// "float32", "uint8", ...; "unknown" for a value outside the enum.
std::string_view dtype_name(DType dtype);
// Inverse of dtype_name; nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);

// What a tensor is, without its bytes: travels inside ObjectRefs and TransportMetadata.
struct TensorMeta {
  std::vector<int64_t> shape;  // empty = a scalar, or a raw byte buffer described by nbytes alone
  DType dtype = DType::kUInt8;
  std::string device = "cpu";
  uint64_t nbytes = 0;  // authoritative byte length

  // Meta for a raw byte buffer of `n` bytes (shape {n}, uint8, cpu).
  static TensorMeta bytes(uint64_t n);
  // Meta for a dense tensor; nbytes = product(shape) * dtype_size(dtype).
  static TensorMeta dense(std::vector<int64_t> shape, DType dtype, std::string device = "cpu");
  bool operator==(const TensorMeta&) const = default;
};

// A read-only view of one tensor's bytes plus its description. Does not own the bytes.
struct Tensor {
  std::span<const std::byte> data;
  TensorMeta meta;

  // A uint8 view over `data` (shape {size}).
  static Tensor bytes(std::span<const std::byte> data);
};

// A writable view a fetch lands in. Does not own the bytes.
using MutableBuffer = std::span<std::byte>;

}  // namespace ferry
