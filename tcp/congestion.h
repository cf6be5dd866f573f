// Congestion control for TCP data channels (ContextOptions::tcp_congestion). Internal: the TCP
// transport and ferry-bench's raw-socket ping-pong use it.
//
// Between two endpoints of one host there is no network for congestion control to share, but a
// pacing algorithm still paces: with BBR (a common system default), the kernel spreads each
// chunk over its bandwidth estimate with high-resolution timers, and a fetch pattern (a burst,
// then idle until the next request) keeps that estimate low. On the 2-core development VM,
// loopback fetches of 1 MiB moved 5.6-6.1 GB/s under BBR and 10.0-11.1 GB/s under cubic
// (bench/README.md, "TCP congestion control on one host").
#pragma once

#include <boost/asio/ip/address.hpp>
#include <string>

namespace ferry::tcp {

// Whether a connection from `local` to `remote` stays on this host: a loopback peer, or the same
// address at both ends (the kernel routes a host's own address over loopback).
bool same_host(const boost::asio::ip::address& local, const boost::asio::ip::address& remote);

// Whether `algorithm` paces its sends (BBR in any version).
bool paces(const std::string& algorithm);

// Applies `option` to a data channel's connected socket `fd` and returns the algorithm it uses
// afterwards ("" if the kernel does not say). `option`: "" (automatic) switches a same_host()
// connection whose algorithm paces to cubic (reno where cubic is refused) and leaves every other
// one alone; "system" leaves every socket alone; any other text names the algorithm for every data
// channel. Never fails the connection: an algorithm the kernel refuses (unknown, or not in
// net.ipv4.tcp_allowed_congestion_control for an unprivileged process) is logged, a warning
// the first time in a process, and the socket keeps what it had. Any thread; the caller owns the
// socket.
std::string tune_congestion(int fd, const std::string& option);

}  // namespace ferry::tcp
