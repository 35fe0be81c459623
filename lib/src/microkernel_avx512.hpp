// Internal: the library's own micro-kernels for packed_gemm (gemm.hpp) on AVX-512 CPUs, where BLIS's row-storing
// ones are AVX2. One MR x NR tile with packed_gemm's operands and contract (C = alpha * A_i @ B_j + beta * C,
// sequential FMA sums over p). Declarations and constants only: microkernel_avx512.cpp, built with -mavx512f,
// includes this and nothing with inline code.
#pragma once

#include <cstdint>

namespace attn::detail {

// 12 rows of two AVX-512 vectors: 12 x 32 in float, 12 x 16 in double (24 of the 32 registers accumulate).
inline constexpr std::int64_t own_micro_kernel_rows = 12, own_micro_kernel_vectors = 2;
template <class T>
inline constexpr std::int64_t own_micro_kernel_columns = own_micro_kernel_vectors * 64 / sizeof(T);

void own_micro_kernel_avx512(std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c,
                             std::int64_t rs_c, std::int64_t cs_c);
void own_micro_kernel_avx512(std::int64_t k, double alpha, const double* a, const double* b, double beta, double* c,
                             std::int64_t rs_c, std::int64_t cs_c);

}  // namespace attn::detail
