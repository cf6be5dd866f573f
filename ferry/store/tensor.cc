#include "ferry/store/tensor.h"

#include <array>
#include <utility>

namespace ferry {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::kUInt8, "uint8", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kBool, "bool", 1},
}};

const DTypeInfo* find(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

size_t dtype_size(DType dtype) {
  const auto* info = find(dtype);
  return info ? info->size : 0;
}

std::string_view dtype_name(DType dtype) {
  const auto* info = find(dtype);
  return info ? info->name : std::string_view("unknown");
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

TensorMeta TensorMeta::bytes(uint64_t n) {
  return TensorMeta{{static_cast<int64_t>(n)}, DType::kUInt8, "cpu", n};
}

TensorMeta TensorMeta::dense(std::vector<int64_t> shape, DType dtype, std::string device) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d < 0 ? 0 : d);
  return TensorMeta{std::move(shape), dtype, std::move(device), n};
}

Tensor Tensor::bytes(std::span<const std::byte> data) {
  return Tensor{data, TensorMeta::bytes(data.size())};
}

}  // namespace ferry
