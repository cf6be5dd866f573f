# What `cmake --install` puts under the prefix, and the .deb that `make package` builds from it:
#   lib/       the libraries (static, or shared with SONAMEs: BUILD_SHARED_LIBS)
#   include/   ferry/... (the public headers, installed by each folder's CMakeLists.txt)
#   lib/cmake/ferry/  ferryConfig.cmake: find_package(ferry [COMPONENTS tcp rdma])
#   lib/pkgconfig/ferry.pc
#   bin/       ferry, ferry-bench (cli/, bench/)
#   the Python package (python/CMakeLists.txt: FERRY_PYTHON_INSTALL_DIR)

# The installed libraries; the umbrella ferry::ferry is not among them: ferryConfig.cmake makes
# it from the components the consumer asks for.
set(FERRY_LIBRARIES ferry_store ferry_mem ferry_proto ferry_net ferry_tcp ferry_cma
  ferry_rdma ferry_collective)

# SONAME libferry_net.so.0.1 while the major version is 0: a 0.x minor release may change the
# ABI (ferryConfigVersion.cmake accepts the same minor version only), a patch release does not.
# From 1.0 on, libferry_net.so.<major>. Each library finds its siblings in its own folder.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(FERRY_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(FERRY_SOVERSION ${PROJECT_VERSION_MAJOR})
endif()
set_target_properties(${FERRY_LIBRARIES} PROPERTIES VERSION ${PROJECT_VERSION}
  SOVERSION ${FERRY_SOVERSION})
if(BUILD_SHARED_LIBS AND NOT FERRY_LIBDIR_IS_SYSTEM)
  set_target_properties(${FERRY_LIBRARIES} PROPERTIES INSTALL_RPATH "$ORIGIN")
endif()

install(TARGETS ${FERRY_LIBRARIES}
  EXPORT ferryTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

# ferryConfig.cmake learns what this build is: static or shared, with RDMA or without.
if(BUILD_SHARED_LIBS)
  set(FERRY_SHARED 1)
else()
  set(FERRY_SHARED 0)
endif()
configure_package_config_file(cmake/ferryConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ferryConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ferryConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ferryConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/ferryConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)

# ferry.pc, for builds without CMake: the whole library (every transport built). Relocatable
# (prefix from the .pc file's own folder), like ferryConfig.cmake, so `cmake --install --prefix`
# anywhere works. A static ferry's own dependencies are private: `pkg-config --static --libs
# ferry` adds them; a shared ferry's libraries carry them (DT_NEEDED). fmt is public (log.h).
file(RELATIVE_PATH FERRY_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig
  ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" FERRY_PC_TO_PREFIX "${FERRY_PC_TO_PREFIX}")
# ferry_rdma is always there (the transport, or its stand-in without RDMA): ferry.h calls it.
set(FERRY_PC_LIBS "-lferry_collective -lferry_rdma -lferry_cma -lferry_tcp -lferry_net -lferry_store -lferry_mem")
if(BUILD_SHARED_LIBS)
  set(FERRY_PC_REQUIRES_PRIVATE "")
  set(FERRY_PC_LIBS_PRIVATE "")
else()
  set(FERRY_PC_REQUIRES_PRIVATE "protobuf openssl")
  if(FERRY_HAS_RDMA)
    string(APPEND FERRY_PC_REQUIRES_PRIVATE " libibverbs librdmacm")
  endif()
  set(FERRY_PC_LIBS_PRIVATE "-lferry_proto")
endif()
configure_file(cmake/ferry.pc.in ${CMAKE_CURRENT_BINARY_DIR}/ferry.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The .deb: `make package` configures a shared build for the /usr prefix and runs cpack in it.
# One package, ferry_<version>_<arch>.deb, carrying what `cmake --install` installs: the shared
# libraries, headers, CMake and pkg-config files, ferry and ferry-bench, the Python package.
# Depends: the libraries the ELF files load, computed by dpkg-shlibdeps, and the interpreter and
# numpy the Python package imports. Building against it needs headers that are not ferry's own
# (Boost.Asio, fmt): Suggests, listed in the README.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ferry)
set(CPACK_PACKAGE_VENDOR ferry)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "asynchronous tensor and buffer transfers between processes (TCP, RDMA)")
set(CPACK_PACKAGE_DESCRIPTION "ferry moves tensors and buffers between processes on different
machines: a process puts buffers into its store and hands out small refs, peers fetch them
into their own memory over one-sided RDMA READs (RoCE v2) or a TCP data channel. This package
carries the C++ library (shared), its headers and CMake/pkg-config files, the ferry and
ferry-bench command-line tools, and the Python package.")
set(FERRY_PACKAGE_MAINTAINER "ferry maintainers" CACHE STRING "Maintainer field of the .deb")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${FERRY_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# A shlibs file (other packages' dpkg-shlibdeps resolve libferry_*.so.<soversion> to ferry) and
# the ldconfig trigger that comes with it.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
get_property(FERRY_PYTHON_DEB_DEPENDS GLOBAL PROPERTY FERRY_PYTHON_DEB_DEPENDS)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${FERRY_PYTHON_DEB_DEPENDS}")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libboost1.81-dev, libfmt-dev, g++, cmake | pkg-config")
set(CPACK_STRIP_FILES ON)
include(CPack)
