// `ferry serve --metrics HOST:PORT`: Context::stats() in Prometheus' text format over HTTP
// (GET /metrics), for a scraper.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <system_error>
#include <thread>

namespace ferry::cli {

// Serves `render()` at GET /metrics on its own thread, one connection at a time: a scrape costs
// a stats snapshot and one write, and keeping it off the Context's io threads means a slow or
// stuck scraper never delays a transfer. Each connection is bounded: 8 KiB of request and 2 s to
// send it, 2 s to take the answer; other paths get 404, other methods 405.
class MetricsServer {
 public:
  MetricsServer() = default;
  ~MetricsServer();  // stops and joins
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Listens on `address` (IP:PORT; port 0 picks one) and starts serving. Returns the bound
  // address in `bound`. Errors: invalid_argument for a bad address, or the system's.
  std::error_code start(const std::string& address, std::function<std::string()> render,
                        std::string& bound);

 private:
  void run();
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace ferry::cli
