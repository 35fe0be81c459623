# cmake -DATTN=<attn> -DKERNEL=<lib.so> -DCASES=<dir> -DSYMPTOM=<regex> -P check_fuzz.cmake
# `attn fuzz --kernel` on a kernel with a bug the fuzzer must find: exit 1, a finding saved under CASES (never in
# attn's own corpus or regressions), its symptom matching SYMPTOM, and a replay line naming the kernel.
file(REMOVE_RECURSE ${CASES})
execute_process(COMMAND ${ATTN} fuzz --kernel ${KERNEL} --target sdpa --minutes 0.2 --cases-dir ${CASES}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "expected attn fuzz to find the bug of ${KERNEL} (exit 1); it exited with ${rc}")
endif()
if(NOT out MATCHES "finding saved to \"${CASES}/[a-z_]+/fuzz/sdpa/")
  message(FATAL_ERROR "the finding was not saved under ${CASES}")
endif()
if(NOT out MATCHES "${SYMPTOM}")
  message(FATAL_ERROR "the finding's symptom does not match '${SYMPTOM}'")
endif()
if(NOT out MATCHES "replay: ATTN_FUZZ_KERNEL=")
  message(FATAL_ERROR "the replay line does not name the kernel")
endif()
