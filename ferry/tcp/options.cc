#include "ferry/tcp/options.h"

#include "ferry/net/system/env.h"

namespace ferry::tcp {

TcpOptions TcpOptions::from_environment() {
  TcpOptions o;
  o.congestion = env_text("FERRY_TCP_CONGESTION");
  return o;
}

}  // namespace ferry::tcp
