// The library's own micro-kernels for the tiled kernel's products on AVX-512 CPUs (gemm.hpp, own_micro_kernel):
// BLIS 0.9.0's AVX-512 kernels (skx) store their tile by columns, where the tiled kernel stores it by rows, and the
// row-storing ones it has are AVX2 (zen3, haswell), half the width. Same contract as BLIS's micro-kernels
// (packed_gemm): C (MR x NR) = alpha * A (MR x k) @ B (k x NR) + beta * C, each dot product one sequential FMA sum
// over p = 0..k-1 from zero, then one multiplication by alpha, then (beta != 0) one fused beta * C + that; C is not
// read when beta is 0. This file alone is compiled with -mavx512f (lib/CMakeLists.txt; the build has no -march), so
// it includes no header with inline functions another file could take its AVX-512 copy of; called only where the CPU
// has AVX-512F.
#include <immintrin.h>

#include "microkernel_avx512.hpp"

namespace attn::detail {

using Index = std::int64_t;  // attn/tensor.hpp's

namespace {

// MR rows of accumulators, each NR / lanes vectors, plus two rows of B and one broadcast of A.
constexpr int rows = int(own_micro_kernel_rows), vectors = int(own_micro_kernel_vectors);

template <int Lanes, class V, class T, class Set1, class Load, class Fma, class Mul, class Store>
__attribute__((always_inline)) inline void kernel(Index k, T alpha, const T* a, const T* b, T beta, T* c, Index rs_c,
                                                  Index cs_c, Set1 set1, Load load, Fma fma, Mul mul, Store store) {
    constexpr int nr = Lanes * vectors;
    static_assert(nr == own_micro_kernel_columns<T>);
    V acc[rows][vectors];
#pragma GCC unroll 12
    for (int r = 0; r < rows; ++r)
        for (int h = 0; h < vectors; ++h) acc[r][h] = set1(T(0));
    for (Index p = 0; p < k; ++p) {
        const T* bp = b + p * nr;
        const T* ap = a + p * rows;
        V bv[vectors];
        for (int h = 0; h < vectors; ++h) bv[h] = load(bp + h * Lanes);
#pragma GCC unroll 12
        for (int r = 0; r < rows; ++r) {
            const V ar = set1(ap[r]);
            for (int h = 0; h < vectors; ++h) acc[r][h] = fma(ar, bv[h], acc[r][h]);
        }
    }
    const V va = set1(alpha), vb = set1(beta);
    alignas(64) T lane[Lanes];
    for (int r = 0; r < rows; ++r)
        for (int h = 0; h < vectors; ++h) {
            V v = mul(va, acc[r][h]);
            if (cs_c == 1) {
                T* at = c + r * rs_c + h * Lanes;
                if (beta != T(0)) v = fma(vb, load(at), v);
                store(at, v);
            } else {
                store(lane, v);
                for (int l = 0; l < Lanes; ++l) {
                    T* at = c + r * rs_c + (h * Lanes + l) * cs_c;
                    // fma(beta, C, alpha AB) in one rounding, as the vector path above.
                    *at = beta != T(0) ? __builtin_fma(beta, *at, lane[l]) : lane[l];
                }
            }
        }
}

}  // namespace

void own_micro_kernel_avx512(Index k, float alpha, const float* a, const float* b,
                                                                 float beta, float* c, Index rs_c, Index cs_c) {
    kernel<16, __m512>(
        k, alpha, a, b, beta, c, rs_c, cs_c, [](float x) { return _mm512_set1_ps(x); },
        [](const float* p) { return _mm512_loadu_ps(p); },
        [](__m512 x, __m512 y, __m512 z) { return _mm512_fmadd_ps(x, y, z); },
        [](__m512 x, __m512 y) { return _mm512_mul_ps(x, y); },
        [](float* p, __m512 v) { _mm512_storeu_ps(p, v); });
}

void own_micro_kernel_avx512(Index k, double alpha, const double* a,
                                                                 const double* b, double beta, double* c, Index rs_c,
                                                                 Index cs_c) {
    kernel<8, __m512d>(
        k, alpha, a, b, beta, c, rs_c, cs_c,
        [](double x) { return _mm512_set1_pd(x); },
        [](const double* p) { return _mm512_loadu_pd(p); },
        [](__m512d x, __m512d y, __m512d z) { return _mm512_fmadd_pd(x, y, z); },
        [](__m512d x, __m512d y) { return _mm512_mul_pd(x, y); },
        [](double* p, __m512d v) { _mm512_storeu_pd(p, v); });
}

}  // namespace attn::detail

