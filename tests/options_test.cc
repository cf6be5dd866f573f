// ContextOptions: the environment read in one place (from_environment), and each transport's own
// options carried to it through the registry, a user transport's as the built-ins'.
#include <gtest/gtest.h>
#include <sched.h>

#include <any>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "ferry/net/system/cpus.h"
#include "tests/test_util.h"

namespace ferry {
namespace {

// Sets (or, with nullptr, unsets) an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool registered(std::string_view name) {
  for (const auto& t : registered_transports()) {
    if (t.name == name) return true;
  }
  return false;
}

TEST(ContextOptions, FromEnvironmentReadsEveryVariable) {
  ScopedEnv transport("FERRY_TRANSPORT", "tcp"), secret("FERRY_SECRET", "s3cret"),
      cert("FERRY_TLS_CERT", "/certs/server.pem"), key("FERRY_TLS_KEY", "/certs/server.key"),
      ca("FERRY_TLS_CA", "/certs/ca.pem"), pool("FERRY_POOL_BYTES", "512M"),
      congestion("FERRY_TCP_CONGESTION", "cubic"), grants("FERRY_RDMA_GRANTS", "registrations"),
      cma("FERRY_CMA_PREFERRED", "1"), populate("FERRY_POOL_POPULATE_THREADS", "12"),
      spin("FERRY_IO_SPIN_US", "250"), max_mr("FERRY_RDMA_MAX_REGISTRATION", "256M"),
      fork("FERRY_RDMA_FORK_PROTECTION", "yes");
  const ContextOptions o = ContextOptions::from_environment();
  EXPECT_EQ(o.idle_spin, std::chrono::microseconds(250));
  EXPECT_EQ(o.transport, "TCP");
  EXPECT_EQ(o.secret, "s3cret");
  EXPECT_EQ(o.tls.certificate, "/certs/server.pem");
  EXPECT_EQ(o.tls.private_key, "/certs/server.key");
  EXPECT_EQ(o.tls.ca, "/certs/ca.pem");
  EXPECT_EQ(o.pool_bytes, size_t{512} << 20);
  EXPECT_EQ(o.pool_populate_threads, 12u);
  // The transports' variables, read by the transports' own from_environment().
  EXPECT_EQ(o.transport_options_for<tcp::TcpOptions>(tcp::kTransportName).congestion, "cubic");
  EXPECT_EQ(tcp::TcpOptions::from_environment().congestion, "cubic");
  EXPECT_TRUE(o.transport_options_for<cma::CmaOptions>(cma::kTransportName).preferred);
  EXPECT_EQ(rdma::RdmaOptions::from_environment().grants, rdma::RdmaGrants::registrations);
  EXPECT_EQ(rdma::RdmaOptions::from_environment().max_registration, size_t{256} << 20);
  EXPECT_TRUE(rdma::RdmaOptions::from_environment().fork_protection);
  if (registered(rdma::kRdmaTransportName)) {  // a build with RDMA support
    EXPECT_EQ(o.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).grants,
              rdma::RdmaGrants::registrations);
    EXPECT_EQ(o.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).max_registration,
              size_t{256} << 20);
  }
}

TEST(ContextOptions, TheDefaultsReadNothingFromTheEnvironment) {
  ScopedEnv transport("FERRY_TRANSPORT", "tcp"), secret("FERRY_SECRET", "s3cret"),
      cert("FERRY_TLS_CERT", "/certs/server.pem"), pool("FERRY_POOL_BYTES", "512M"),
      congestion("FERRY_TCP_CONGESTION", "cubic"), grants("FERRY_RDMA_GRANTS", "regions"),
      populate("FERRY_POOL_POPULATE_THREADS", "12"), spin("FERRY_IO_SPIN_US", "250");
  const ContextOptions o;
  EXPECT_EQ(o.idle_spin, ContextOptions::default_idle_spin());
  EXPECT_EQ(ContextOptions::default_idle_spin().count(), usable_cores() >= 4 ? 50 : 0);
  EXPECT_EQ(o.transport, "auto");
  EXPECT_TRUE(o.secret.empty());
  EXPECT_FALSE(o.tls.enabled());
  EXPECT_EQ(o.pool_bytes, ContextOptions::default_pool_bytes());
  EXPECT_EQ(o.pool_populate_threads, 4u);
  EXPECT_TRUE(o.transport_options.empty());
  EXPECT_EQ(o.transport_options_for<tcp::TcpOptions>(tcp::kTransportName).congestion, "");
  EXPECT_EQ(o.transport_options_for<rdma::RdmaOptions>(rdma::kRdmaTransportName).grants,
            rdma::RdmaGrants::automatic);
}

TEST(ContextOptions, FromEnvironmentKeepsTheDefaultForWhatItCannotUse) {
  {
    ScopedEnv transport("FERRY_TRANSPORT", nullptr), pool("FERRY_POOL_BYTES", "lots"),
        grants("FERRY_RDMA_GRANTS", "sometimes"), cma("FERRY_CMA_PREFERRED", "perhaps"),
        fork("FERRY_RDMA_FORK_PROTECTION", "perhaps");
    for (const char* bad : {"big", "1T", "-5", "4 M", "99999999999999999999G", ""}) {
      ScopedEnv max_mr("FERRY_RDMA_MAX_REGISTRATION", bad);
      EXPECT_EQ(rdma::RdmaOptions::from_environment().max_registration, 0u) << bad;
    }
    const ContextOptions o = ContextOptions::from_environment();
    for (const char* bad : {"0", "many", "4x", "257", "-1"}) {
      ScopedEnv populate("FERRY_POOL_POPULATE_THREADS", bad);
      EXPECT_EQ(ContextOptions::from_environment().pool_populate_threads, 4u) << bad;
    }
    for (const char* bad : {"fast", "50us", "10001", "-1"}) {
      ScopedEnv spin("FERRY_IO_SPIN_US", bad);
      EXPECT_EQ(ContextOptions::from_environment().idle_spin, ContextOptions::default_idle_spin())
          << bad;
    }
    ScopedEnv off("FERRY_IO_SPIN_US", "0");
    EXPECT_EQ(ContextOptions::from_environment().idle_spin.count(), 0);
    EXPECT_FALSE(o.transport_options_for<cma::CmaOptions>(cma::kTransportName).preferred);
    EXPECT_EQ(o.transport, "auto");
    EXPECT_EQ(o.pool_bytes, ContextOptions::default_pool_bytes());
    EXPECT_EQ(rdma::RdmaOptions::from_environment().grants, rdma::RdmaGrants::automatic);
    EXPECT_FALSE(rdma::RdmaOptions::from_environment().fork_protection);
  }
  // Transport names: the built-ins in any case, any other name as it is.
  for (const auto& [text, want] : std::vector<std::pair<const char*, const char*>>{
           {"AUTO", "auto"}, {"Rdma", "RDMA"}, {"tcp", "TCP"}, {"cma", "CMA"}, {"SHM", "SHM"}}) {
    ScopedEnv transport("FERRY_TRANSPORT", text);
    EXPECT_EQ(ContextOptions::from_environment().transport, want) << text;
  }
}

// A user transport's own options, as examples/shm_transport declares ShmOptions.
struct OwnOptions {
  int depth = 1;
  std::string label = "default";
  static OwnOptions from_environment() {
    OwnOptions o;
    o.label = "from the environment";
    return o;
  }
};

TEST(Registry, AUserTransportGetsItsOwnOptionsThroughTheRegistry) {
  auto seen = std::make_shared<std::vector<OwnOptions>>();  // what each factory call got
  ASSERT_FALSE(register_transport<OwnOptions>(
      "OWN", {"cpu"},
      [seen](const TransportEnv&,
             const OwnOptions& options) -> Result<std::shared_ptr<TransportManager>> {
        seen->push_back(options);
        return std::shared_ptr<TransportManager>(std::make_shared<test::FakeTransport>("OWN"));
      },
      &OwnOptions::from_environment));

  // Set by the application: the factory gets exactly those.
  ContextOptions set;
  auto& own = set.transport_options_for<OwnOptions>("OWN");
  own.depth = 7;
  own.label = "set";
  EXPECT_TRUE(Context(set).transport("OWN"));
  ASSERT_EQ(seen->size(), 1u);
  EXPECT_EQ(seen->back().depth, 7);
  EXPECT_EQ(seen->back().label, "set");

  // Not set: the type's defaults.
  EXPECT_TRUE(Context(ContextOptions{}).transport("OWN"));
  ASSERT_EQ(seen->size(), 2u);
  EXPECT_EQ(seen->back().depth, 1);
  EXPECT_EQ(seen->back().label, "default");

  // ContextOptions::from_environment(): what the transport's own from_environment() gives.
  const ContextOptions environment = ContextOptions::from_environment();
  EXPECT_EQ(environment.transport_options_for<OwnOptions>("OWN").label, "from the environment");
  EXPECT_TRUE(Context(environment).transport("OWN"));
  ASSERT_EQ(seen->size(), 3u);
  EXPECT_EQ(seen->back().label, "from the environment");

  // An entry of another type: the factory is not called; the context goes on without the
  // transport, or fails when it asked for it by name.
  ContextOptions wrong;
  wrong.transport_options["OWN"] = std::string("not OwnOptions");
  {
    Context ctx(wrong);
    EXPECT_FALSE(ctx.transport("OWN"));
    EXPECT_TRUE(ctx.transport(tcp::kTransportName));
  }
  wrong.transports = {"OWN"};
  EXPECT_EQ(Context::create(wrong).error(), errc::invalid_argument);
  EXPECT_EQ(seen->size(), 3u);
  EXPECT_THROW(wrong.transport_options_for<OwnOptions>("OWN"), std::bad_any_cast);

  // The typed registration's own errors are the plain one's.
  EXPECT_EQ(register_transport<OwnOptions>("OWN2", {"cpu"}, nullptr), errc::invalid_argument);
  EXPECT_EQ(
      register_transport<OwnOptions>(
          "OWN", {"cpu"},
          [](const TransportEnv&, const OwnOptions&) -> Result<std::shared_ptr<TransportManager>> {
            return make_error_code(errc::device_error);
          }),
      errc::transport_duplicate);
  EXPECT_FALSE(unregister_transport("OWN"));
  EXPECT_FALSE(ContextOptions::from_environment().transport_options.contains("OWN"));
}

// A transport instance may outlive its Context (registry.h), holding a pin on one of its
// objects: dropping it then collects the object without reaching into the Context that is gone,
// and the transport, alive, still hears of it (its garbage_collect runs once per object, before
// the memory goes), as it does of each object collected while the Context lives.
TEST(Registry, APinATransportHoldsPastItsContextIsDroppedSafely) {
  struct Held {
    ObjectStore* store = nullptr;
    std::shared_ptr<test::FakeTransport> transport;
  };
  auto held = std::make_shared<Held>();
  ASSERT_FALSE(register_transport(
      "PINS", {"cpu"},
      [held](const TransportEnv& env) -> Result<std::shared_ptr<TransportManager>> {
        held->store = &env.store;
        held->transport = std::make_shared<test::FakeTransport>("PINS");
        return std::shared_ptr<TransportManager>(held->transport);
      }));
  ObjectStore::Pin pin;
  {
    Context ctx(ContextOptions{});
    ASSERT_TRUE(held->transport);
    auto bytes = test::make_pattern(4096, 3);
    auto gone = ctx.put({Tensor::bytes(*bytes)}, bytes);
    auto kept = ctx.put({Tensor::bytes(*bytes)}, bytes);
    ASSERT_TRUE(gone && kept);
    EXPECT_TRUE(ctx.release(*gone));
    EXPECT_EQ(held->transport->collected.load(), 1);
    pin = held->store->pin(kept->object_id);
    ASSERT_TRUE(pin);
    EXPECT_TRUE(ctx.release(*kept));
    EXPECT_EQ(held->transport->collected.load(), 1) << "collected while still pinned";
  }
  pin = {};  // the object's last hold, after its Context
  EXPECT_EQ(held->transport->collected.load(), 2);
  held->transport.reset();
  EXPECT_FALSE(unregister_transport("PINS"));
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// usable_cores() counts the affinity mask (taskset, a container's cpuset), not the machine.
TEST(UsableCores, FollowTheAffinityMask) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(usable_cores(), static_cast<unsigned>(CPU_COUNT(&all)));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(usable_cores(), 1u);
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(usable_cores(), static_cast<unsigned>(CPU_COUNT(&all)));
}

}  // namespace
}  // namespace ferry
