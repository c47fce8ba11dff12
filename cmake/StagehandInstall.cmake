# Install rules and the Stagehand CMake package: the libraries as Stagehand::<layer> targets,
# the public headers under include/stagehand/<layer>/, the CAF and Gloo finders the package needs.
include(CMakePackageConfigHelpers)

get_property(_stagehand_libraries GLOBAL PROPERTY STAGEHAND_LIBRARIES)
install(TARGETS ${_stagehand_libraries}
  EXPORT StagehandTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

foreach(_layer IN LISTS STAGEHAND_LAYERS)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_layer}/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/stagehand/${_layer}
    FILES_MATCHING PATTERN "*.hpp"
    # Internal to their layer's .cpp files.
    PATTERN "s3_request.hpp" EXCLUDE
    PATTERN "json_fields.hpp" EXCLUDE
    PATTERN "block_bytes.hpp" EXCLUDE
    PATTERN "posix_io.hpp" EXCLUDE
    PATTERN "trainer_base.hpp" EXCLUDE)
endforeach()

set(_stagehand_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/Stagehand)
install(EXPORT StagehandTargets NAMESPACE Stagehand:: DESTINATION ${_stagehand_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/StagehandConfig.cmake.in
  ${PROJECT_BINARY_DIR}/StagehandConfig.cmake
  INSTALL_DESTINATION ${_stagehand_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/StagehandConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/StagehandConfig.cmake
  ${PROJECT_BINARY_DIR}/StagehandConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindCAF.cmake
  ${PROJECT_SOURCE_DIR}/cmake/FindGloo.cmake
  DESTINATION ${_stagehand_cmake_dir})
