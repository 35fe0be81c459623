# cmake -DATTN=<attn> -DKERNEL=<lib.so> -DEXPECT=<property or empty> -DSKIPS=<0|1> -DCASES=<dir> -P check_kernel.cmake
# EXPECT empty: `attn properties --kernel` must pass (exit 0). EXPECT refused:<regex>: it must refuse the file (exit 2)
# with a message matching the regex. Otherwise it must fail (exit 1) with a FAIL line for
# the property EXPECT; any other outcome (a crash of attn itself, exit 2, the wrong property) fails the test.
execute_process(COMMAND ${ATTN} properties --kernel ${KERNEL} --cases-dir ${CASES} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(EXPECT MATCHES "^refused:(.*)")
  # A file that is no usable kernel: exit 2, and the message on stderr.
  set(why "${CMAKE_MATCH_1}")
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${why}")
    message(FATAL_ERROR "expected attn to refuse ${KERNEL} with exit 2 and a message matching '${why}'; exit ${rc}")
  endif()
elseif(EXPECT STREQUAL "")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected ${KERNEL} to pass every property; attn exited with ${rc}")
  endif()
  # SKIPS: the kernel declares less than the suite draws, and the output must say what was skipped and why.
  if(SKIPS AND NOT out MATCHES "skipped [0-9]+ cases: an explicit allowed_mask \\(the kernel declares no bool masks\\)")
    message(FATAL_ERROR "expected ${KERNEL}'s skipped cases to be listed; they were not")
  endif()
  # Cases the kernel ABI cannot express (version 1 has no soft-capping, bias or ALiBi field) are skipped for every
  # kernel; any other skip of a kernel that declares everything is a failure.
  string(REGEX REPLACE "skipped [0-9]+ cases: (a softcap \\(the kernel ABI has no soft-capping field\\)|an additive bias or ALiBi \\(the kernel ABI has neither field\\))" "" out_rest "${out}")
  if(NOT SKIPS AND out_rest MATCHES "skipped [0-9]+ cases")
    message(FATAL_ERROR "${KERNEL} declares everything the suite draws, yet cases were skipped")
  endif()
else()
  if(NOT rc EQUAL 1)
    message(FATAL_ERROR "expected ${KERNEL} to fail the suite (exit 1); attn exited with ${rc}")
  endif()
  if(NOT out MATCHES "\n${EXPECT} +[a-z_0-9]+ +(float|double) +FAIL")
    message(FATAL_ERROR "expected ${KERNEL} to fail ${EXPECT}; it did not")
  endif()
  # Every failure is saved with the line that replays it against the kernel.
  if(NOT out MATCHES "reproduce: [^\n]*properties --kernel '${KERNEL}' --replay '${CASES}/")
    message(FATAL_ERROR "the failures of ${KERNEL} were not saved under ${CASES} with a replay line naming the kernel")
  endif()
endif()
