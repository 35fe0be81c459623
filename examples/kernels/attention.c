/* examples/kernels/attention.c: a correct attention kernel in plain C for attn's kernel ABI (attn/kernel_abi.h),
 * and, compiled with one ATTN_EXAMPLE_BUG_* macro, the same kernel with one classic bug (CMakeLists.txt builds each;
 * ctest runs attn's property suite on every one and requires the correct kernel to pass and each buggy one to fail
 * with the property that names its bug).
 *
 * Per (batch, head): logits S = scale * q k^T over the keys the query may read, a softmax over them with the row
 * maximum subtracted, then out = P v. It computes in double whatever the storage type and rounds each result once,
 * so attn's "generic" error model bounds it with room to spare. */
#include <attn/kernel_abi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef ATTN_EXAMPLE_NAME
#define ATTN_EXAMPLE_NAME "example_correct"
#endif

static int64_t at(const DLTensor* t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return a * t->strides[0] + b * t->strides[1] + c * t->strides[2] + d * t->strides[3];
}

static double load(const DLTensor* t, int64_t offset) {
    return t->dtype.bits == 32 ? (double)((const float*)t->data)[offset] : ((const double*)t->data)[offset];
}

static void store(DLTensor* t, int64_t offset, double x) {
    if (t->dtype.bits == 32) ((float*)t->data)[offset] = (float)x;
    else ((double*)t->data)[offset] = x;
}

static int may_read(const attn_kernel_forward_args* a, int64_t b, int64_t h, int64_t i, int64_t j, int64_t Tq, int64_t Tk) {
    if (a->causal == ATTN_KERNEL_CAUSAL_TL && j > i) return 0;
    if (a->causal == ATTN_KERNEL_CAUSAL_BR && j > i + Tk - Tq) return 0;
    if (a->allowed_mask && !((const uint8_t*)a->allowed_mask->data)[at(a->allowed_mask, b, h, i, j)]) return 0;
    return 1;
}

/* Softmax of each row of s (Tq x Tk) over the keys it may read (ok[i * Tk + j]); p gets the weights. A row with no
 * key it may read gets p = 0 and empty[i] = 1. */
static void softmax_rows(const double* s, const char* ok, int64_t Tq, int64_t Tk, double* p, char* empty) {
#if defined(ATTN_EXAMPLE_BUG_SOFTMAX_OVER_QUERIES)
    /* BUG: normalised over the queries (columns) instead of the keys. */
    for (int64_t j = 0; j < Tk; ++j) {
        double m = -INFINITY, sum = 0;
        for (int64_t i = 0; i < Tq; ++i)
            if (ok[i * Tk + j] && s[i * Tk + j] > m) m = s[i * Tk + j];
        for (int64_t i = 0; i < Tq; ++i) sum += p[i * Tk + j] = ok[i * Tk + j] ? exp(s[i * Tk + j] - m) : 0.0;
        for (int64_t i = 0; i < Tq; ++i)
            if (sum > 0) p[i * Tk + j] /= sum;
    }
    for (int64_t i = 0; i < Tq; ++i) {
        empty[i] = 1;
        for (int64_t j = 0; j < Tk; ++j) empty[i] &= !ok[i * Tk + j];
    }
#else
    for (int64_t i = 0; i < Tq; ++i) {
        const double* row = s + i * Tk;
        const char* row_ok = ok + i * Tk;
        double* w = p + i * Tk;
        double m = -INFINITY, sum = 0;
        int any = 0;
#if defined(ATTN_EXAMPLE_BUG_CRASH_ON_ONE_KEY)
        /* BUG: the keys are counted in halves, and a single key makes halves of no keys (division by zero). */
        volatile int64_t half = Tk / 2;
        const int64_t halves = Tk / half;
        if (halves < 0) continue;
#endif
        for (int64_t j = 0; j < Tk; ++j) {
#if defined(ATTN_EXAMPLE_BUG_FINITE_SENTINEL)
            /* BUG: a blocked key gets the logit -1e4 instead of being left out. */
            const double x = row_ok[j] ? row[j] : -1e4;
            any = 1;
            if (x > m) m = x;
#elif defined(ATTN_EXAMPLE_BUG_MASK_AFTER_SOFTMAX)
            /* BUG: the softmax runs over every key; the mask is applied to the weights afterwards. */
            any |= row_ok[j];
            if (row[j] > m) m = row[j];
#else
            if (!row_ok[j]) continue;
            any = 1;
            if (row[j] > m) m = row[j];
#endif
        }
        empty[i] = !any;
        for (int64_t j = 0; j < Tk; ++j) {
#if defined(ATTN_EXAMPLE_BUG_FINITE_SENTINEL)
            w[j] = exp((row_ok[j] ? row[j] : -1e4) - m);
#elif defined(ATTN_EXAMPLE_BUG_MASK_AFTER_SOFTMAX)
            w[j] = exp(row[j] - m);
#else
            w[j] = row_ok[j] ? exp(row[j] - m) : 0.0;
#endif
            sum += w[j];
        }
        for (int64_t j = 0; j < Tk; ++j) {
            w[j] = any ? w[j] / sum : 0.0;
#if defined(ATTN_EXAMPLE_BUG_MASK_AFTER_SOFTMAX)
            if (!row_ok[j]) w[j] = 0.0;
#endif
        }
#if defined(ATTN_EXAMPLE_BUG_FINITE_SENTINEL)
        /* With the sentinel, a row of blocked keys looks like any other row. */
        empty[i] = 0;
#endif
    }
#endif
}

static int32_t forward(const attn_kernel_forward_args* a, char* message, size_t message_size) {
    const int64_t B = a->q->shape[0], H = a->q->shape[1], Tq = a->q->shape[2], Dk = a->q->shape[3];
    const int64_t G = a->k->shape[1], Tk = a->k->shape[2], Dv = a->v->shape[3];
    if (G <= 0 || H % G != 0) {
        snprintf(message, message_size, "%lld query heads do not split into %lld K/V head groups", (long long)H, (long long)G);
        return ATTN_KERNEL_FAILED;
    }
    double* s = malloc(sizeof(double) * (size_t)(Tq * Tk + 1));
    double* p = malloc(sizeof(double) * (size_t)(Tq * Tk + 1));
    char* ok = malloc((size_t)(Tq * Tk + 1));
    char* empty = malloc((size_t)(Tq + 1));
    if (!s || !p || !ok || !empty) {
        free(s), free(p), free(ok), free(empty);
        snprintf(message, message_size, "out of memory");
        return ATTN_KERNEL_FAILED;
    }
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const int64_t g = h / (H / G); /* the K/V head this query head reads */
            for (int64_t i = 0; i < Tq; ++i)
                for (int64_t j = 0; j < Tk; ++j) {
                    ok[i * Tk + j] = (char)may_read(a, b, h, i, j, Tq, Tk);
                    double dot = 0;
                    if (ok[i * Tk + j])
                        for (int64_t d = 0; d < Dk; ++d) dot += load(a->q, at(a->q, b, h, i, d)) * load(a->k, at(a->k, b, g, j, d));
                    s[i * Tk + j] = a->scale * dot;
                }
            softmax_rows(s, ok, Tq, Tk, p, empty);
            const double fill = a->empty_rows == ATTN_KERNEL_EMPTY_NAN ? NAN : 0.0;
            for (int64_t i = 0; i < Tq; ++i) {
                for (int64_t d = 0; d < Dv; ++d) {
                    double acc = 0;
                    for (int64_t j = 0; j < Tk; ++j)
#if defined(ATTN_EXAMPLE_BUG_FINITE_SENTINEL)
                        acc += p[i * Tk + j] * load(a->v, at(a->v, b, g, j, d)); /* every key, as a dense P V does */
#else
                        if (ok[i * Tk + j]) acc += p[i * Tk + j] * load(a->v, at(a->v, b, g, j, d));
#endif
                    store(a->out, at(a->out, b, h, i, d), empty[i] ? fill : acc);
                }
                if (a->weights)
                    for (int64_t j = 0; j < Tk; ++j) store(a->weights, at(a->weights, b, h, i, j), empty[i] ? fill : p[i * Tk + j]);
            }
        }
    free(s), free(p), free(ok), free(empty);
    return ATTN_KERNEL_OK;
}

ATTN_KERNEL_EXPORT const attn_kernel* attn_kernel_get(void) {
#if defined(ATTN_EXAMPLE_DECLARES_LITTLE)
    /* The same kernel declaring only float32, no masks, no empty-row policy, dense inputs and no weights: attn then
     * sends it nothing else and lists what it skipped. */
    static const attn_kernel kernel = {
        .abi_version = ATTN_KERNEL_ABI_VERSION,
        .name = ATTN_EXAMPLE_NAME,
        .version = "1.0",
        .description = "plain-C attention declaring little (examples/kernels/attention.c)",
        .dtypes = ATTN_KERNEL_FLOAT32,
        .error_model = "generic",
        .forward = forward,
    };
#else
    static const attn_kernel kernel = {
        .abi_version = ATTN_KERNEL_ABI_VERSION,
        .name = ATTN_EXAMPLE_NAME,
        .version = "1.0",
        .description = "plain-C attention computed in double, rounded once (examples/kernels/attention.c)",
        .dtypes = ATTN_KERNEL_FLOAT32 | ATTN_KERNEL_FLOAT64,
        .masks = ATTN_KERNEL_MASK_BOOL | ATTN_KERNEL_CAUSAL_TOP_LEFT | ATTN_KERNEL_CAUSAL_BOTTOM_RIGHT,
        .empty_rows = ATTN_KERNEL_EMPTY_ZERO | ATTN_KERNEL_EMPTY_NAN,
        .gqa = 1,
        .strided = 1,
        .weights = 1,
        .error_model = "generic",
        .forward = forward,
    };
#endif
    return &kernel;
}
