/// @file
/// "host:port" parsing (IPv6 hosts in brackets: "[::1]:7000").
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ferry {

/// A parsed "host:port": the host without brackets, the port as its digits.
struct HostPort {
  std::string host;  ///< name or IP (IPv6 without its brackets); "0.0.0.0" when the text had none
  std::string port;  ///< decimal digits, 0 to 65535
};

/// Splits "host:port", "[v6]:port" or ":port" (host "0.0.0.0"). nullopt without a port, with a port
/// that is not 0-65535 in digits, or with an unclosed bracket. Any thread.
std::optional<HostPort> parse_host_port(std::string_view text);
/// "host:port", with the host in brackets when it contains a ':' (IPv6): the inverse of
/// parse_host_port(). Any thread.
std::string format_host_port(std::string_view host, unsigned port);

}  // namespace ferry
