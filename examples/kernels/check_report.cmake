# cmake -DATTN=<attn> -DKERNEL=<lib.so> -DCASES=<dir> -DEXPECT_RC=<0|1> -DEXPECT=<regex> -P check_report.cmake
# `attn report --kernel --quick --check`: its exit code, and the report it writes under CASES matching EXPECT.
file(REMOVE_RECURSE ${CASES})
execute_process(COMMAND ${ATTN} report --kernel ${KERNEL} --quick --no-plots --check --cases-dir ${CASES}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
file(GLOB report ${CASES}/*/report/accuracy.md)
if(NOT rc EQUAL EXPECT_RC OR NOT report)
  message(FATAL_ERROR "expected exit ${EXPECT_RC} and a report under ${CASES}; exit ${rc}, report '${report}'")
endif()
file(READ ${report} text)
if(NOT text MATCHES "${EXPECT}")
  message(FATAL_ERROR "the report ${report} does not match '${EXPECT}'")
endif()
