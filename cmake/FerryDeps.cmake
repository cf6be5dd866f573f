# Dependencies, all from Debian 12 packages (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(Boost 1.81 REQUIRED CONFIG)
find_package(Protobuf REQUIRED)
find_package(fmt REQUIRED)
find_package(OpenSSL REQUIRED)  # HMAC for the shared-secret handshake

# RDMA: AUTO builds it when rdma-core is present, ON insists, OFF skips.
set(FERRY_HAS_RDMA 0)
if(NOT FERRY_RDMA STREQUAL "OFF")
  find_package(PkgConfig)
  if(PkgConfig_FOUND)
    pkg_check_modules(IBVERBS IMPORTED_TARGET libibverbs)
    pkg_check_modules(RDMACM IMPORTED_TARGET librdmacm)
  endif()
  if(IBVERBS_FOUND AND RDMACM_FOUND)
    set(FERRY_HAS_RDMA 1)
  elseif(FERRY_RDMA STREQUAL "ON")
    message(FATAL_ERROR "FERRY_RDMA=ON but libibverbs/librdmacm were not found "
                        "(apt-get install libibverbs-dev librdmacm-dev)")
  endif()
endif()
message(STATUS "ferry: RDMA support ${FERRY_HAS_RDMA} (FERRY_RDMA=${FERRY_RDMA})")
