// The only file that includes blis.h.
#include "gemm.hpp"

#include <blis.h>

namespace attn::detail {

namespace {
rntm_t single_thread() {
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    return rntm;
}
trans_t trans(bool t) { return t ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE; }
}  // namespace

template <>
void gemm<float>(bool ta, bool tb, Index m, Index n, Index k, float alpha, const float* a, Index rs_a, Index cs_a,
                 const float* b, Index rs_b, Index cs_b, float beta, float* c, Index rs_c, Index cs_c) {
    if (m == 0 || n == 0) return;
    rntm_t rntm = single_thread();
    bli_sgemm_ex(trans(ta), trans(tb), m, n, k, &alpha, const_cast<float*>(a), rs_a, cs_a, const_cast<float*>(b), rs_b,
                 cs_b, &beta, c, rs_c, cs_c, nullptr, &rntm);
}

template <>
void gemm<double>(bool ta, bool tb, Index m, Index n, Index k, double alpha, const double* a, Index rs_a, Index cs_a,
                  const double* b, Index rs_b, Index cs_b, double beta, double* c, Index rs_c, Index cs_c) {
    if (m == 0 || n == 0) return;
    rntm_t rntm = single_thread();
    bli_dgemm_ex(trans(ta), trans(tb), m, n, k, &alpha, const_cast<double*>(a), rs_a, cs_a, const_cast<double*>(b),
                 rs_b, cs_b, &beta, c, rs_c, cs_c, nullptr, &rntm);
}

const char* blis_version() { return bli_info_get_version_str(); }

}  // namespace attn::detail
