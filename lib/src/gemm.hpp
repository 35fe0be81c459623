// Internal: the library's one doorway to BLIS (general-stride gemm, single-threaded per call).
#pragma once

#include "attn/tensor.hpp"

namespace attn::detail {

// C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, with row and column strides for every
// operand (BLIS's typed API, so transposed and strided views need no copy). Runs on the calling thread
// only: parallelism is over (batch, head) outside, which keeps results independent of the thread count.
template <class T>
void gemm(bool transpose_a, bool transpose_b, Index m, Index n, Index k, T alpha, const T* a, Index rs_a, Index cs_a,
          const T* b, Index rs_b, Index cs_b, T beta, T* c, Index rs_c, Index cs_c);

// BLIS's version string, for reports.
const char* blis_version();

}  // namespace attn::detail
