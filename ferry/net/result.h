// Result<T>: a value or a std::error_code, for setup functions that can fail.
#pragma once

#include <cassert>
#include <system_error>
#include <utility>
#include <variant>

namespace ferry {

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(std::error_code ec) : v_(ec) { assert(ec); }  // NOLINT
  template <typename E, typename = std::enable_if_t<std::is_error_code_enum_v<E>>>
  Result(E e) : Result(std::error_code(make_error_code(e))) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  std::error_code error() const { return ok() ? std::error_code{} : std::get<std::error_code>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, std::error_code> v_;
};

}  // namespace ferry
