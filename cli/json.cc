#include "cli/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace ferry::cli {

// ---------------------------------------------------------------- writer

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (has_items_.empty()) return;
  if (has_items_.back()) out_ += ',';
  has_items_.back() = true;
  out_ += '\n';
  out_.append(2 * has_items_.size(), ' ');
}

void JsonWriter::close(char bracket) {
  const bool had_items = has_items_.back();
  has_items_.pop_back();
  if (had_items) {
    out_ += '\n';
    out_.append(2 * has_items_.size(), ' ');
  }
  out_ += bracket;
  if (has_items_.empty()) out_ += '\n';
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  close('}');
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  has_items_.push_back(false);
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  close(']');
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  value(name);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view text) {
  before_value();
  out_ += '"';
  for (char c : text) {
    switch (c) {
      case '"':
        out_ += "\\\"";
        break;
      case '\\':
        out_ += "\\\\";
        break;
      case '\n':
        out_ += "\\n";
        break;
      case '\r':
        out_ += "\\r";
        break;
      case '\t':
        out_ += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out_ += buf;
        } else {
          out_ += c;
        }
    }
  }
  out_ += '"';
  return *this;
}

JsonWriter& JsonWriter::value(uint64_t number) {
  before_value();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(double number) {
  if (!std::isfinite(number)) return null();
  before_value();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", number);
  out_ += buf;
  return *this;
}

JsonWriter& JsonWriter::value(bool flag) {
  before_value();
  out_ += flag ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ += "null";
  return *this;
}

// ---------------------------------------------------------------- reader

const JsonValue* JsonValue::find(std::string_view name) const {
  for (const auto& [k, v] : members) {
    if (k == name) return &v;
  }
  return nullptr;
}

std::optional<uint64_t> JsonValue::as_uint64() const {
  uint64_t value = 0;
  if (type != Type::kNumber) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  std::optional<JsonValue> document(std::string& error) {
    JsonValue v;
    if (parse_value(v, 0)) {
      skip_space();
      if (pos_ == s_.size()) return v;
      error_ = "unexpected trailing characters";
    }
    error = error_ + " at offset " + std::to_string(pos_);
    return std::nullopt;
  }

 private:
  bool fail(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool parse_value(JsonValue& v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    skip_space();
    if (pos_ >= s_.size()) return fail("unexpected end of input");
    const char c = s_[pos_];
    if (c == '{') return parse_object(v, depth);
    if (c == '[') return parse_array(v, depth);
    if (c == '"') {
      v.type = JsonValue::Type::kString;
      return parse_string(v.text);
    }
    if (consume("true")) {
      v.type = JsonValue::Type::kBool;
      v.flag = true;
      return true;
    }
    if (consume("false")) {
      v.type = JsonValue::Type::kBool;
      return true;
    }
    if (consume("null")) return true;
    return parse_number(v);
  }

  bool parse_number(JsonValue& v) {
    const size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > from;
    };
    const size_t int_start = pos_;
    if (!digits()) return fail("expected a value");
    if (s_[int_start] == '0' && pos_ - int_start > 1) return fail("leading zero in number");
    if (pos_ < s_.size() && s_[pos_] == '.' && (++pos_, !digits())) return fail("bad fraction");
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) return fail("bad exponent");
    }
    v.type = JsonValue::Type::kNumber;
    v.text = std::string(s_.substr(start, pos_ - start));
    return true;
  }

  bool parse_hex4(uint32_t& out) {
    if (pos_ + 4 > s_.size()) return fail("truncated \\u escape");
    auto [end, ec] = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, out, 16);
    if (ec != std::errc() || end != s_.data() + pos_ + 4) return fail("bad \\u escape");
    pos_ += 4;
    return true;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  bool parse_string(std::string& out) {
    ++pos_;  // the opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!parse_hex4(cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {  // a surrogate pair
            uint32_t low = 0;
            if (!consume("\\u") || !parse_hex4(low) || low < 0xdc00 || low >= 0xe000) {
              return fail("unpaired surrogate");
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }

  bool parse_array(JsonValue& v, int depth) {
    v.type = JsonValue::Type::kArray;
    ++pos_;
    skip_space();
    if (consume("]")) return true;
    for (;;) {
      if (!parse_value(v.items.emplace_back(), depth + 1)) return false;
      skip_space();
      if (consume("]")) return true;
      if (!consume(",")) return fail("expected ',' or ']'");
    }
  }

  bool parse_object(JsonValue& v, int depth) {
    v.type = JsonValue::Type::kObject;
    ++pos_;
    skip_space();
    if (consume("}")) return true;
    for (;;) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a member name");
      auto& member = v.members.emplace_back();
      if (!parse_string(member.first)) return false;
      skip_space();
      if (!consume(":")) return fail("expected ':'");
      if (!parse_value(member.second, depth + 1)) return false;
      skip_space();
      if (consume("}")) return true;
      if (!consume(",")) return fail("expected ',' or '}'");
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

std::optional<JsonValue> parse_json(std::string_view text, std::string& error) {
  return Parser(text).document(error);
}

}  // namespace ferry::cli
