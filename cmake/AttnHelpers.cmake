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
