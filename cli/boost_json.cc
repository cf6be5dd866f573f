// Boost.JSON's compiled part, built into the ferry tool (ferry_cli_manifest): Boost.JSON used
// header-only, from the Boost headers ferry already needs (libboost1.81-dev), so there is no
// libboost-json library to install or to depend on at run time. This is the one translation unit
// that includes it.
#include <boost/json/src.hpp>
