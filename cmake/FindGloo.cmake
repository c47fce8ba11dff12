# FindGloo: locates Gloo, Meta's collective communications library (Debian's libgloo-dev).
#
# Debian ships a GlooConfig.cmake, but it exports a bare `gloo` target imported for RelWithDebInfo
# only; this module gives the namespaced target for every build type instead.
# Defines Gloo_FOUND, Gloo_INCLUDE_DIRS, Gloo_VERSION and the imported target Gloo::gloo. Stagehand
# needs Gloo's TCP transport: a Gloo built without it is reported as not found.

find_path(Gloo_INCLUDE_DIR NAMES gloo/config.h)
find_library(Gloo_LIBRARY NAMES gloo)

set(Gloo_VERSION "")
set(_gloo_has_tcp "")
if(Gloo_INCLUDE_DIR AND EXISTS "${Gloo_INCLUDE_DIR}/gloo/config.h")
  file(STRINGS "${Gloo_INCLUDE_DIR}/gloo/config.h" _gloo_config REGEX "^#define GLOO_(VERSION_[A-Z]+|HAVE_TRANSPORT_TCP) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "GLOO_VERSION_${_part} ([0-9]+)" _match "${_gloo_config}")
    list(APPEND _gloo_version_parts "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN _gloo_version_parts "." Gloo_VERSION)
  if(_gloo_config MATCHES "GLOO_HAVE_TRANSPORT_TCP 1")
    set(_gloo_has_tcp TRUE)
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Gloo
  REQUIRED_VARS Gloo_LIBRARY Gloo_INCLUDE_DIR _gloo_has_tcp
  VERSION_VAR Gloo_VERSION
  REASON_FAILURE_MESSAGE "Stagehand needs Gloo with its TCP transport (Debian: apt-get install libgloo-dev)")

if(Gloo_FOUND)
  set(Gloo_INCLUDE_DIRS "${Gloo_INCLUDE_DIR}")
  if(NOT TARGET Gloo::gloo)
    add_library(Gloo::gloo UNKNOWN IMPORTED)
    set_target_properties(Gloo::gloo PROPERTIES
      IMPORTED_LOCATION "${Gloo_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${Gloo_INCLUDE_DIR}")
  endif()
endif()

mark_as_advanced(Gloo_INCLUDE_DIR Gloo_LIBRARY)
unset(_gloo_config)
unset(_gloo_version_parts)
unset(_gloo_has_tcp)
