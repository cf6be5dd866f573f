// "host:port" parsing (IPv6 hosts in brackets: "[::1]:7000").
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ferry {

struct HostPort {
  std::string host;
  std::string port;
};

std::optional<HostPort> parse_host_port(std::string_view text);
std::string format_host_port(std::string_view host, unsigned port);

}  // namespace ferry
