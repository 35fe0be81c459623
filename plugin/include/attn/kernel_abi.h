/* attn/kernel_abi.h: the C interface through which attn runs its property suite on an attention kernel it did not
 * compile. A kernel library (a shared object) exports one function, attn_kernel_get, returning a description of the
 * kernel: what it supports, how it rounds, and its forward entry point. Tensors cross as DLPack DLTensor views
 * (dlpack/dlpack.h, Debian's libdlpack-dev).
 *
 *   #include <attn/kernel_abi.h>
 *   static int32_t forward(const attn_kernel_forward_args* a, char* message, size_t message_size) { ... }
 *   ATTN_KERNEL_EXPORT const attn_kernel* attn_kernel_get(void) {
 *       static const attn_kernel k = {ATTN_KERNEL_ABI_VERSION, "mine", "1.0", ...};
 *       return &k;
 *   }
 *
 * attn never loads a kernel into its own process: a worker process (attn-kernel-worker) loads it and runs each call,
 * so a kernel that crashes, hangs or writes past its output costs one case (reported, shrunk and saved), not the run.
 *
 * Versioning: ATTN_KERNEL_ABI_VERSION changes whenever a struct below changes layout or meaning. The loader refuses a
 * kernel whose abi_version differs from its own, naming both. */
#ifndef ATTN_KERNEL_ABI_H
#define ATTN_KERNEL_ABI_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_KERNEL_ABI_VERSION 1

#if defined(_WIN32)
#define ATTN_KERNEL_EXPORT __declspec(dllexport)
#else
#define ATTN_KERNEL_EXPORT __attribute__((visibility("default")))
#endif

/* Storage types a kernel takes (attn_kernel.dtypes, bit flags). q, k, v, out and weights share one. */
enum {
    ATTN_KERNEL_FLOAT32 = 1u << 0, /* DLDataType {kDLFloat, 32, 1} */
    ATTN_KERNEL_FLOAT64 = 1u << 1, /* DLDataType {kDLFloat, 64, 1} */
    ATTN_KERNEL_FLOAT16 = 1u << 2, /* DLDataType {kDLFloat, 16, 1}: reserved, attn does not send it yet */
    ATTN_KERNEL_BFLOAT16 = 1u << 3 /* DLDataType {kDLBfloat, 16, 1}: reserved, attn does not send it yet */
};

/* Masks a kernel applies (attn_kernel.masks, bit flags). A case needing a mask kind the kernel lacks is skipped and
 * counted, never silently passed: without ATTN_KERNEL_MASK_BOOL no case with an explicit mask runs; without a
 * causal flag, a causal case runs as an explicit mask when the kernel takes one. */
enum {
    ATTN_KERNEL_MASK_BOOL = 1u << 0,           /* attn_kernel_forward_args.allowed_mask */
    ATTN_KERNEL_CAUSAL_TOP_LEFT = 1u << 1,     /* causal = ATTN_KERNEL_CAUSAL_TL */
    ATTN_KERNEL_CAUSAL_BOTTOM_RIGHT = 1u << 2  /* causal = ATTN_KERNEL_CAUSAL_BR */
};

/* attn_kernel_forward_args.causal. Query i may read key j when j <= i (top-left) or j <= i + Tk - Tq (bottom-right,
 * the last query row sees every key); and-ed with allowed_mask when both are given. */
enum { ATTN_KERNEL_NOT_CAUSAL = 0, ATTN_KERNEL_CAUSAL_TL = 1, ATTN_KERNEL_CAUSAL_BR = 2 };

/* What a query row with no allowed key must hold (attn_kernel.empty_rows, bit flags; and
 * attn_kernel_forward_args.empty_rows, one of them). Rows that are not empty never depend on it. A call whose
 * policy is "refuse" never reaches the kernel: attn refuses it itself. */
enum { ATTN_KERNEL_EMPTY_ZERO = 1u << 0, ATTN_KERNEL_EMPTY_NAN = 1u << 1 };

/* What a forward call returns. */
enum {
    ATTN_KERNEL_OK = 0,
    ATTN_KERNEL_UNSUPPORTED = 1, /* a case outside what the kernel does (message: what); counted as skipped */
    ATTN_KERNEL_FAILED = 2       /* anything else (message: why); the property that made the call fails */
};

/* One forward call. Shapes (always rank 4; DLTensor.strides is never NULL and counts elements, byte_offset is 0):
 *   q (B, H, Tq, Dk); k (B, G, Tk, Dk); v (B, G, Tk, Dv); out (B, H, Tq, Dv), dense row-major.
 *   G == H, or, when the kernel declares gqa, any G dividing H: query head h reads K/V head h / (H / G).
 *   allowed_mask (B, H, Tq, Tk), DLDataType {kDLUInt, 8, 1} holding 0 or 1 (1 = may attend), or NULL.
 *   weights (B, H, Tq, Tk), dense, or NULL: the softmax weights, asked for only when the kernel declares weights.
 * Without gqa, K/V heads shared by several query heads arrive repeated (G == H).
 * Strides: dense row-major unless the kernel declares strided; then q, k and v arrive in the (B, T, H, D) memory
 * order attention layers produce (strides (T H D, D, H D, 1)), and the mask with stride 0 on every dim it
 * broadcasts over (a padding mask (B, 1, 1, Tk) has strides (Tk, 0, 0, 1)).
 * Every value at a position some query may read is finite unless the case is about NaN propagation; values at
 * positions nobody may read are arbitrary (NaN included) and must never reach out. */
typedef struct attn_kernel_forward_args {
    const DLTensor* q;
    const DLTensor* k;
    const DLTensor* v;
    const DLTensor* allowed_mask; /* NULL: no explicit mask */
    DLTensor* out;
    DLTensor* weights;            /* NULL: not asked for */
    double scale;                 /* multiplies q k^T before the softmax (1/sqrt(Dk) unless the case sets it) */
    int32_t causal;               /* ATTN_KERNEL_NOT_CAUSAL, ATTN_KERNEL_CAUSAL_TL or ATTN_KERNEL_CAUSAL_BR */
    int32_t empty_rows;           /* ATTN_KERNEL_EMPTY_ZERO or ATTN_KERNEL_EMPTY_NAN */
    int32_t num_threads;          /* 0: the kernel's default; results must not depend on it */
} attn_kernel_forward_args;

/* Returns ATTN_KERNEL_OK, or another status with a NUL-terminated message written into message (at most
 * message_size bytes, the terminator included). */
typedef int32_t (*attn_kernel_forward_fn)(const attn_kernel_forward_args* args, char* message, size_t message_size);

/* The description a kernel library exports. Strings are static and NUL-terminated. */
typedef struct attn_kernel {
    uint32_t abi_version;     /* ATTN_KERNEL_ABI_VERSION as the kernel was compiled */
    const char* name;         /* letters, digits and '_': names the kernel in every message, case file and report */
    const char* version;      /* the kernel's own version, free text */
    const char* description;  /* one sentence */
    uint32_t dtypes;          /* ATTN_KERNEL_FLOAT32 | ... */
    uint32_t masks;           /* ATTN_KERNEL_MASK_BOOL | ATTN_KERNEL_CAUSAL_... */
    uint32_t empty_rows;      /* ATTN_KERNEL_EMPTY_ZERO | ATTN_KERNEL_EMPTY_NAN */
    int32_t gqa;              /* 1: fewer K/V heads than query heads (G divides H) */
    int32_t strided;          /* 1: honours DLTensor.strides on its inputs (stride 0 included) */
    int32_t weights;          /* 1: fills args.weights when it is not NULL */
    int64_t max_dk, max_dv;   /* head dims it takes; 0: no limit */
    /* Its error model (how the oracle bounds its rounding; see README "Check your own kernel"):
     *   "generic": any summation order, exp within exp_ulps (safe for any kernel, and the loosest);
     *   "reference": materialised logits, the scale applied after the dot products, exp within exp_ulps;
     *   "tiled": online softmax over blocks of key_block keys, exp or exp2 within exp_ulps. */
    const char* error_model;
    int64_t key_block;        /* "tiled" only */
    double exp_ulps;          /* 0: the model's default */
    attn_kernel_forward_fn forward;
    void* reserved[4];        /* NULL (the backward pass and low precision take these in a later version) */
} attn_kernel;

/* The one symbol a kernel library exports. */
typedef const attn_kernel* (*attn_kernel_get_fn)(void);
#define ATTN_KERNEL_ENTRY_POINT "attn_kernel_get"

#ifdef __cplusplus
}
#endif

#endif /* ATTN_KERNEL_ABI_H */
