#include "ferry/cma/options.h"

#include <string>

#include "ferry/net/system/env.h"

namespace ferry::cma {

CmaOptions CmaOptions::from_environment() {
  CmaOptions o;
  o.preferred = env_flag("FERRY_CMA_PREFERRED", o.preferred);
  return o;
}

}  // namespace ferry::cma
