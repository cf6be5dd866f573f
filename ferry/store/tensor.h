/// @file
/// Tensor descriptions: shapes, dtypes, devices, and views of the bytes behind them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

/// Element types. The numeric values travel on the wire; never renumber.
enum class DType : uint8_t {
  kUInt8 = 0,     ///< unsigned 8-bit integer ("uint8"); also raw bytes
  kInt8 = 1,      ///< signed 8-bit integer ("int8")
  kInt16 = 2,     ///< signed 16-bit integer ("int16")
  kInt32 = 3,     ///< signed 32-bit integer ("int32")
  kInt64 = 4,     ///< signed 64-bit integer ("int64")
  kFloat16 = 5,   ///< IEEE 754 half precision ("float16")
  kBFloat16 = 6,  ///< bfloat16: float32's upper 16 bits ("bfloat16")
  kFloat32 = 7,   ///< IEEE 754 single precision ("float32")
  kFloat64 = 8,   ///< IEEE 754 double precision ("float64")
  kBool = 9,      ///< one byte per element, 0 or 1 ("bool")
};

/// Size of one element in bytes; 0 for a value outside the enum.
size_t dtype_size(DType dtype);
/// "float32", "uint8", ...; "unknown" for a value outside the enum.
std::string_view dtype_name(DType dtype);
/// Inverse of dtype_name; nullopt for an unknown name.
std::optional<DType> dtype_from_name(std::string_view name);

/// What a tensor is, without its bytes: travels inside ObjectRefs and TransportMetadata.
struct TensorMeta {
  std::vector<int64_t> shape;  ///< empty = a scalar, or a raw byte buffer described by nbytes alone
  DType dtype = DType::kUInt8;  ///< element type
  std::string device = "cpu";   ///< where the bytes live; ferry moves "cpu" memory
  uint64_t nbytes = 0;          ///< authoritative byte length
  /// CRC-32C of the bytes (ferry/store/checksum.h) when the owner put them with
  /// PutOptions::checksum: a fetch checks what landed against it (FetchOptions::verify).
  std::optional<uint32_t> checksum;

  /// Meta for a raw byte buffer of `n` bytes (shape {n}, uint8, cpu).
  static TensorMeta bytes(uint64_t n);
  /// Meta for a dense tensor; nbytes = product(shape) * dtype_size(dtype).
  static TensorMeta dense(std::vector<int64_t> shape, DType dtype, std::string device = "cpu");
  /// Field by field.
  bool operator==(const TensorMeta&) const = default;
};

/// A read-only view of one tensor's bytes plus its description. Does not own the bytes.
struct Tensor {
  std::span<const std::byte> data;  ///< the bytes, meta.nbytes of them (put() checks)
  TensorMeta meta;                  ///< what they are

  /// A uint8 view over `data` (shape {size}).
  static Tensor bytes(std::span<const std::byte> data);
};

/// A writable view a fetch lands in. Does not own the bytes.
using MutableBuffer = std::span<std::byte>;

}  // namespace ferry
