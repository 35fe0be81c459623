# FindBLIS: Debian's libblis-dev ships no pkg-config or CMake file. Defines BLIS::BLIS.
#   BLIS_INCLUDE_DIR  directory of blis.h
#   BLIS_STATIC_LIBRARY  libblis.a, the static archive: the library picks the BLIS configuration of each product for
#                     this CPU from BLIS's registry of contexts (lib/src/gemm.cpp), which the shared library does not
#                     export. Its threading variant (Debian's alternatives: openmp, pthread or serial) needs OpenMP or
#                     pthreads, which attn links; the library runs every BLIS call on one thread.
find_path(BLIS_INCLUDE_DIR NAMES blis.h PATH_SUFFIXES blis)
find_library(BLIS_STATIC_LIBRARY NAMES libblis.a)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BLIS REQUIRED_VARS BLIS_STATIC_LIBRARY BLIS_INCLUDE_DIR)
if(BLIS_FOUND AND NOT TARGET BLIS::BLIS)
  find_package(Threads REQUIRED)
  add_library(BLIS::BLIS STATIC IMPORTED)
  set_target_properties(BLIS::BLIS PROPERTIES IMPORTED_LOCATION "${BLIS_STATIC_LIBRARY}"
                                              INTERFACE_INCLUDE_DIRECTORIES "${BLIS_INCLUDE_DIR}"
                                              INTERFACE_LINK_LIBRARIES "Threads::Threads;m")
endif()
mark_as_advanced(BLIS_INCLUDE_DIR BLIS_STATIC_LIBRARY)
