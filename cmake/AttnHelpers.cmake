# Warnings for every target of the project, and the one-line test registration helper.
function(attn_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic)
endfunction()

# attn_add_test(NAME SOURCES... [LIBS ...] [LABELS ...]): a Catch2 test executable registered with ctest.
function(attn_add_test name)
  cmake_parse_arguments(ARG "" "" "LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE attn_catch_main attn::attn ${ARG_LIBS})
  attn_warnings(${name})
  add_test(NAME ${name} COMMAND ${name} --order rand --rng-seed 20261130 WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()

# The Highway targets the dispatching build compiles on x86-64 (sdpa_tiled.cpp; HWY_WANT_AVX3_DL in
# lib/CMakeLists.txt adds AVX3_DL), best first. attn_tiled_test checks that this list is exactly
# attn::simd_targets_compiled(), so it cannot go stale.
# The last is the portable fallback: Highway compiles HWY_SCALAR instead of HWY_EMU128 under g++ < 12.3 (GCC bug
# 106322, hwy/detect_targets.h).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12.3)
  set(ATTN_SIMD_TARGETS AVX3_DL AVX3 AVX2 SSE4 SSSE3 SCALAR)
else()
  set(ATTN_SIMD_TARGETS AVX3_DL AVX3 AVX2 SSE4 SSSE3 EMU128)
endif()

# attn_add_simd_tests(NAME [ENVIRONMENT ...] [LABELS ...] COMMAND ...): one ctest test per SIMD target, NAME_simd_<T>,
# running COMMAND with ATTN_SIMD_TARGET=<T> (the tiled kernel dispatches to T); skipped where the CPU lacks T.
function(attn_add_simd_tests name)
  cmake_parse_arguments(ARG "" "" "ENVIRONMENT;LABELS;COMMAND" ${ARGN})
  foreach(target ${ATTN_SIMD_TARGETS})
    add_test(NAME ${name}_simd_${target} COMMAND ${ARG_COMMAND} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(${name}_simd_${target} PROPERTIES SKIP_RETURN_CODE 77 LABELS "simd;${ARG_LABELS}"
                         ENVIRONMENT "ATTN_SIMD_TARGET=${target};${ARG_ENVIRONMENT}")
  endforeach()
endfunction()

# attn_split(ENTRY VAR...): the '|'-separated fields of ENTRY into the variables VAR... ("" past the last field),
# for the tables of cases the example and plugin tests are registered from.
function(attn_split entry)
  string(REPLACE "|" ";" fields "${entry}")
  list(LENGTH fields n)
  set(i 0)
  foreach(var ${ARGN})
    set(value "")
    if(i LESS n)
      list(GET fields ${i} value)
    endif()
    set(${var} "${value}" PARENT_SCOPE)
    math(EXPR i "${i} + 1")
  endforeach()
endfunction()
