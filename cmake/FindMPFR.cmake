# FindMPFR: MPFR and the GMP it is built on (Debian's libmpfr-dev ships no CMake file). Defines MPFR::MPFR, which
# links GMP::GMP, and GMP::GMP.
#   MPFR_INCLUDE_DIR  directory of mpfr.h     MPFR_LIBRARY  libmpfr
#   GMP_INCLUDE_DIR   directory of gmp.h      GMP_LIBRARY   libgmp
find_path(MPFR_INCLUDE_DIR NAMES mpfr.h)
find_library(MPFR_LIBRARY NAMES mpfr)
find_path(GMP_INCLUDE_DIR NAMES gmp.h)
find_library(GMP_LIBRARY NAMES gmp)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(MPFR REQUIRED_VARS MPFR_LIBRARY MPFR_INCLUDE_DIR GMP_LIBRARY GMP_INCLUDE_DIR)
if(MPFR_FOUND AND NOT TARGET GMP::GMP)
  add_library(GMP::GMP UNKNOWN IMPORTED)
  set_target_properties(GMP::GMP PROPERTIES IMPORTED_LOCATION "${GMP_LIBRARY}"
                                            INTERFACE_INCLUDE_DIRECTORIES "${GMP_INCLUDE_DIR}")
endif()
if(MPFR_FOUND AND NOT TARGET MPFR::MPFR)
  add_library(MPFR::MPFR UNKNOWN IMPORTED)
  set_target_properties(MPFR::MPFR PROPERTIES IMPORTED_LOCATION "${MPFR_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${MPFR_INCLUDE_DIR}"
                                              INTERFACE_LINK_LIBRARIES GMP::GMP)
endif()
mark_as_advanced(MPFR_INCLUDE_DIR MPFR_LIBRARY GMP_INCLUDE_DIR GMP_LIBRARY)
