/* plugin/tests/misbehaving.c: kernels that break the rules of attn/kernel_abi.h, one way each (chosen by a
 * MISBEHAVE_* macro), for kernel_process_test. They do no attention: without a macro a kernel writes 1 everywhere
 * in out, which is all the host checks here. */
#include <attn/kernel_abi.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int32_t forward(const attn_kernel_forward_args* a, char* message, size_t message_size) {
    const DLTensor* o = a->out;
    const int64_t n = o->shape[0] * o->shape[1] * o->shape[2] * o->shape[3];
    float* out = (float*)o->data;
    for (int64_t x = 0; x < n; ++x) out[x] = 1.0f;
#if defined(MISBEHAVE_CRASH)
    volatile int* nowhere = NULL;
    *nowhere = 1;
#elif defined(MISBEHAVE_HANG)
    for (;;) pause();
#elif defined(MISBEHAVE_WRITE_PAST_END)
    out[n] = 2.0f;
#elif defined(MISBEHAVE_WRITE_BEFORE_START)
    out[-1] = 2.0f;
#elif defined(MISBEHAVE_WRITE_INPUT)
    ((float*)a->k->data)[0] = 2.0f;
#elif defined(MISBEHAVE_UNWRITTEN)
    {
        const uint32_t untouched = 0x7FCA77E1u; /* what the host filled out with: the last element left as it was */
        memcpy(&out[n - 1], &untouched, sizeof untouched);
    }
#elif defined(MISBEHAVE_DECLINE)
    snprintf(message, message_size, "Dk = %lld is not a multiple of 8", (long long)a->q->shape[3]);
    return ATTN_KERNEL_UNSUPPORTED;
#elif defined(MISBEHAVE_FAIL)
    snprintf(message, message_size, "workspace allocation failed");
    return ATTN_KERNEL_FAILED;
#endif
    (void)message, (void)message_size;
    return ATTN_KERNEL_OK;
}

#ifndef MISBEHAVE_NO_ENTRY_POINT
ATTN_KERNEL_EXPORT const attn_kernel* attn_kernel_get(void) {
    static const attn_kernel kernel = {
#if defined(MISBEHAVE_WRONG_ABI)
        .abi_version = ATTN_KERNEL_ABI_VERSION + 1,
#else
        .abi_version = ATTN_KERNEL_ABI_VERSION,
#endif
#if defined(MISBEHAVE_BAD_NAME)
        .name = "my kernel!",
        .error_model = "fast",
#else
        .name = KERNEL_NAME,
        .error_model = "generic",
#endif
        .version = "0",
        .description = "a kernel that misbehaves on purpose",
        .dtypes = ATTN_KERNEL_FLOAT32,
        .forward = forward,
    };
    return &kernel;
}
#else
ATTN_KERNEL_EXPORT int not_a_kernel(void) { return 0; }
#endif
