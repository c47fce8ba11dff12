# FindNCCL: locates NCCL, which ships beside the CUDA toolkit's own headers and libraries.
#
# Defines NCCL_FOUND, NCCL_INCLUDE_DIRS, NCCL_LIBRARIES, NCCL_VERSION and the imported target NCCL::nccl.

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  list(APPEND _nccl_include_hints ${CUDAToolkit_INCLUDE_DIRS})
endif()
if(CUDAToolkit_LIBRARY_DIR)
  list(APPEND _nccl_lib_hints "${CUDAToolkit_LIBRARY_DIR}")
endif()

find_path(NCCL_INCLUDE_DIR NAMES nccl.h
  HINTS ${_nccl_include_hints} ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl
  HINTS ${_nccl_lib_hints} ${_nccl_hints} PATH_SUFFIXES lib64 lib)

set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH +[0-9]+")
  string(REGEX MATCH "[0-9]+$" _nccl_major "${_nccl_major}")
  string(REGEX MATCH "[0-9]+$" _nccl_minor "${_nccl_minor}")
  string(REGEX MATCH "[0-9]+$" _nccl_patch "${_nccl_patch}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS "${NCCL_INCLUDE_DIR}")
  set(NCCL_LIBRARIES "${NCCL_LIBRARY}")
  if(NOT TARGET NCCL::nccl)
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
