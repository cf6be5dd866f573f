/// @file
/// Result<T>: a value or a std::error_code, for setup functions that can fail.
#pragma once

#include <cassert>
#include <system_error>
#include <utility>
#include <variant>

namespace ferry {

/// A value of type T or the std::error_code that kept a call from producing one. Returned by
/// calls that can fail (Context::create, listen, connect, put, ...); test it with ok() or as a
/// bool, then read value() or error(). A plain value type: no locking.
template <typename T>
class Result {
 public:
  /// A success holding `value`.
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  /// A failure; `ec` must be an error (asserted in debug builds).
  Result(std::error_code ec) : v_(ec) { assert(ec); }  // NOLINT
  /// A failure from an error code enum (errc::timed_out, ...).
  template <typename E, typename = std::enable_if_t<std::is_error_code_enum_v<E>>>
  Result(E e) : Result(std::error_code(make_error_code(e))) {}  // NOLINT

  /// True when it holds a value.
  bool ok() const { return std::holds_alternative<T>(v_); }
  /// ok().
  explicit operator bool() const { return ok(); }
  /// The error; an empty error_code when it holds a value.
  std::error_code error() const { return ok() ? std::error_code{} : std::get<std::error_code>(v_); }

  /// The value; throws std::bad_variant_access when it holds an error (check ok() first).
  ///@{
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  ///@}
  /// The value's members, as value().
  ///@{
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  ///@}
  /// value().
  ///@{
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  ///@}

 private:
  std::variant<T, std::error_code> v_;
};

}  // namespace ferry
