// A tiny JSON writer and reader: enough for manifests and --json output, no dependencies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::cli {

// Builds a JSON document front to back; indents with two spaces. Callers keep the structure
// well formed (a key before each value inside an object, matching begin/end calls).
class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  // Names the next value; only inside an object.
  JsonWriter& key(std::string_view name);
  JsonWriter& value(std::string_view text);
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  JsonWriter& value(uint64_t number);
  JsonWriter& value(double number);  // non-finite numbers are written as null
  JsonWriter& value(bool flag);
  JsonWriter& null();

  // The document so far (complete once every begin has its end).
  const std::string& str() const { return out_; }

 private:
  void before_value();
  void close(char bracket);

  std::string out_;
  std::vector<bool> has_items_;  // per open container: whether it has an item yet
  bool after_key_ = false;
};

// A parsed JSON value. Numbers keep their text so 64-bit integers survive exactly.
struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool flag = false;
  std::string text;  // string contents, or the number as written
  std::vector<JsonValue> items;
  std::vector<std::pair<std::string, JsonValue>> members;

  // The member named `name` of an object; null when absent or not an object.
  const JsonValue* find(std::string_view name) const;
  // The number as an unsigned integer; nullopt when not a non-negative integer in range.
  std::optional<uint64_t> as_uint64() const;
  bool is_string() const { return type == Type::kString; }
  bool is_array() const { return type == Type::kArray; }
  bool is_object() const { return type == Type::kObject; }
};

// Parses a whole document (RFC 8259, nesting up to 64 deep). On failure returns nullopt and
// sets `error` to what went wrong and where.
std::optional<JsonValue> parse_json(std::string_view text, std::string& error);

}  // namespace ferry::cli
