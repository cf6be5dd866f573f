// Reading ferry's settings from the environment ($FERRY_*), for the defaults of its options.
#pragma once

#include <cstdlib>
#include <string>

namespace ferry {

// The environment variable's text, "" when it is unset. Any thread (getenv: nothing in ferry
// sets the environment).
inline std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace ferry
