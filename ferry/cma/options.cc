#include "ferry/cma/options.h"

#include <string>

#include "ferry/net/log.h"
#include "ferry/net/system/env.h"

namespace ferry::cma {

CmaOptions CmaOptions::from_environment() {
  CmaOptions o;
  const std::string v = env_text("FERRY_CMA_PREFERRED");
  if (v == "1" || v == "true" || v == "yes") {
    o.preferred = true;
  } else if (!v.empty() && v != "0" && v != "false" && v != "no") {
    FERRY_LOG_WARN("FERRY_CMA_PREFERRED={} is not 1/true/yes or 0/false/no: ignored", v);
  }
  return o;
}

}  // namespace ferry::cma
