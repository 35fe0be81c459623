# FindBLIS: Debian's libblis-dev ships no pkg-config or CMake file. Defines BLIS::BLIS.
#   BLIS_INCLUDE_DIR  directory of blis.h
#   BLIS_LIBRARY      libblis
find_path(BLIS_INCLUDE_DIR NAMES blis.h PATH_SUFFIXES blis)
find_library(BLIS_LIBRARY NAMES blis blis-mt)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BLIS REQUIRED_VARS BLIS_LIBRARY BLIS_INCLUDE_DIR)
if(BLIS_FOUND AND NOT TARGET BLIS::BLIS)
  add_library(BLIS::BLIS UNKNOWN IMPORTED)
  set_target_properties(BLIS::BLIS PROPERTIES IMPORTED_LOCATION "${BLIS_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${BLIS_INCLUDE_DIR}")
endif()
mark_as_advanced(BLIS_INCLUDE_DIR BLIS_LIBRARY)
