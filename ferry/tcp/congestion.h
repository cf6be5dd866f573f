// Congestion control for TCP data channels (TcpOptions::congestion). Internal: the TCP
// transport and ferry-bench's raw-socket ping-pong use it.
//
// Between two endpoints of one host there is no network for congestion control to share and no
// loss, but the common defaults still act as if there were:
// - BBR paces: the kernel spreads each chunk over its bandwidth estimate with high-resolution
//   timers, and a fetch pattern (a burst, then idle until the next request) keeps that estimate
//   low, so loopback fetches move a fraction of what the memory bus allows.
// - cubic's HyStart leaves slow start when round trips grow, and on a busy host they grow with
//   CPU scheduling, not queues: a new connection's window stays small for its first calls.
// Reno has neither: slow start lasts until a loss, which one host does not have, so the window
// follows what the transfers need. The measurements behind this: bench/README.md, "TCP
// congestion control on one host".
#pragma once

#include <boost/asio/ip/address.hpp>
#include <string>

namespace ferry::tcp {

// Whether a connection from `local` to `remote` stays on this host: a loopback peer, or the same
// address at both ends (the kernel routes a host's own address over loopback).
bool same_host(const boost::asio::ip::address& local, const boost::asio::ip::address& remote);

// What a data channel within one host uses when `option` is automatic.
inline constexpr const char* kOneHostCongestion = "reno";

// Applies `option` to a data channel's connected socket `fd` and returns the algorithm it uses
// afterwards ("" if the kernel does not say). `option`: "" (automatic) puts a same_host()
// connection on kOneHostCongestion and leaves every other one alone; "system" leaves every socket
// alone; any other text names the algorithm for every data channel. Never fails the connection: an
// algorithm the kernel refuses (unknown, or not in net.ipv4.tcp_allowed_congestion_control for an
// unprivileged process) is logged, a warning the first time in a process, and the socket keeps what
// it had. Any thread; the caller owns the socket.
std::string tune_congestion(int fd, const std::string& option);

}  // namespace ferry::tcp
