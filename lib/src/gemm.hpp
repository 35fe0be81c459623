// Internal: the library's one doorway to BLIS (general-stride gemm, single-threaded per call).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "attn/machine.hpp"
#include "attn/tensor.hpp"
#include "microkernel_avx512.hpp"

namespace attn::detail {

// BLIS as this process runs it: its version, and the configurations (micro-kernels, so the bits) the library
// chose for this CPU at start-up (BlisChoice in attn/machine.hpp).
std::string blis_version();

// C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, with row and column strides for every
// operand (BLIS's typed API, so transposed and strided views need no copy). Runs on the calling thread
// only: parallelism is over (batch, head) outside, which keeps results independent of the thread count.
// With the chosen configuration's kernels, or those of `configuration` (a name in BlisChoice::runnable; the
// bench measures each).
template <class T>
void gemm(bool transpose_a, bool transpose_b, Index m, Index n, Index k, T alpha, const T* a, Index rs_a, Index cs_a,
          const T* b, Index rs_b, Index cs_b, T beta, T* c, Index rs_c, Index cs_c,
          const char* configuration = nullptr);

// The tiled kernel's micro-kernel tile (MR x NR of the configuration chosen for T, e.g. 6 x 16 for float with AVX2).
struct MicroTile {
    Index mr, nr;
};
template <class T>
MicroTile micro_tile();

// Memory a caller will read soon, asked for a few cache lines at a time between the micro-kernel calls of its products
// (packed_gemm): spread so, the prefetches overlap with arithmetic, where a burst of them would stall on the CPU's
// queue of outstanding misses. Up to three byte ranges, taken in order, and beside them one set of rows (set_rows:
// what the next few calls' caller reads after them, such as the bias rows of the kernel's next tile).
struct Ahead {
    // `left` rows of `bytes`, `stride` apart (a byte range is one row), the current one's lines [next, end) still to
    // ask for.
    struct Lines {
        const char* next = nullptr;
        const char* end = nullptr;
        Index bytes = 0, stride = 0, left = 0;
        Lines() = default;
        Lines(const void* first, Index bytes_, Index stride_, Index rows)
            : next(line_of(static_cast<const char*>(first))), end(static_cast<const char*>(first) + bytes_),
              bytes(bytes_), stride(stride_), left(bytes_ > 0 ? rows : 0) {}
        // Asks for the next line; false once every row is asked for.
        bool ask() {
            __builtin_prefetch(next);
            next += 64;
            if (next >= end && --left > 0) {
                const char* row = end - bytes + stride;
                next = line_of(row), end = row + bytes;
            }
            return left > 0;
        }
    };
    Lines ranges[3];
    int count = 0, current = 0;
    int lines_per_step = 2;
    Lines rows;
    int rows_per_step = 0;  // lines of `rows` per step
    void add(const void* begin, Index bytes) {
        if (bytes > 0 && count < 3) ranges[count++] = Lines(begin, bytes, 0, 1);
    }
    // Replaces the rows (those of the last set not asked for yet are dropped): `count` rows of `bytes` from `first`,
    // `stride` bytes apart, over the next `steps` steps.
    void set_rows(const void* first, Index bytes, Index stride, Index count, Index steps) {
        rows = Lines(first, bytes, stride, count);
        const Index lines = count * (bytes / 64 + 2);  // a row's lines, one more where it straddles
        rows_per_step = static_cast<int>(std::clamp<Index>(lines / std::max<Index>(steps, 1) + 1, 1, 16));
    }
    void step() {
        for (int i = 0; i < lines_per_step && current < count; ++i)
            if (!ranges[current].ask()) ++current;
        for (int i = 0; i < rows_per_step && rows.left > 0; ++i) rows.ask();
    }
    static const char* line_of(const char* p) {
        return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t(63));
    }
};

// A 64-byte aligned buffer for packed operands (packed_gemm's micro-kernels read panels with aligned loads) that only
// grows; its contents are not kept when it grows.
template <class T>
struct PackedBuffer {
    struct Free {
        void operator()(T* p) const { std::free(p); }
    };
    std::unique_ptr<T[], Free> data;
    Index size = 0;
    T* get(Index n) {
        if (n > size) {
            const auto bytes = (static_cast<std::size_t>(n) * sizeof(T) + 63) / 64 * 64;
            data.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
            if (!data) throw std::bad_alloc();
            size = n;
        }
        return data.get();
    }
};

// x rounded up to a multiple of m (panel counts and strides).
inline Index round_up(Index x, Index m) { return (x + m - 1) / m * m; }

// Whole micro-tiles straight through BLIS's native micro-kernel, on operands the caller packed once and reuses
// (no per-call packing; this is how a fused kernel keeps its blocks in cache). For i < m_panels, j < n_panels:
//   C_ij (mr x nr) = alpha * A_i (mr x k) @ B_j (k x nr) + beta * C_ij
// A_i at a + i * ps_a holds column p at a_i + p * mr; B_j at b + j * ps_b holds row p at b_j + p * nr;
// C_ij starts at c + i * ts_m + j * ts_n with element strides rs_c (rows), cs_c (columns), cs_c = 1 being the
// kernel's preferred storage. Each dot product is a sequential (FMA) sum over p = 0..k-1. Packed buffers must be
// 64-byte aligned with ps_a, ps_b multiples of 16 elements. Single-threaded, like gemm. With `ahead`, one step of
// its prefetches after each micro-kernel call.
template <class T>
void packed_gemm(Index m_panels, Index n_panels, Index k, T alpha, const T* a, Index ps_a, const T* b, Index ps_b,
                 T beta, T* c, Index rs_c, Index cs_c, Index ts_m, Index ts_n, Ahead* ahead = nullptr);

// C (m x n) = A (m x k) @ B (k x n), each row-major and contiguous, on packed_gemm's micro-kernels (the tiled
// kernels') in a plain blocked loop that packs blocks of A and B itself, as a BLIS gemm does: the measured limit's
// "packed" row (attn/machine.hpp), the speed the library's own products reach on a large square product. Not a
// general gemm: n must be a multiple of the micro-tile's nr (ConfigError otherwise); m and k are any. Each element
// is the sum over kc-blocks of k, each block's dot product one sequential FMA sum: the first written to C, each
// later one added to it (fl(C + block)).
template <class T>
void packed_blocked_gemm(Index m, Index n, Index k, const T* a, const T* b, T* c);

}  // namespace attn::detail
