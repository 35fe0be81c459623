// The only file that includes blis.h.
#include "gemm.hpp"

#include <blis.h>

namespace attn::detail {

std::string blis_version() { return bli_info_get_version_str(); }
std::string blis_arch() {
    bli_init();
    return bli_arch_string(bli_arch_query_id());
}

namespace {
// One thread, and never BLIS's small-matrix ("sup") path: in BLIS 0.9.0 (Debian 12) its haswell millikernels,
// which BLIS also picks on Intel CPUs with AVX-512 and on Zen, read past the end of A or B for some edge sizes
// (flame/blis#635, #824). On a page boundary that is a SEGV (found by the mha fuzzer under ASan on a Sapphire
// Rapids; valgrind shows the read on regressions/fuzz/mha/blis-sup-overread-*). The conventional path packs A and
// B exactly within m, n, k first. Drop this once the BLIS in deps/debian.txt has those fixes.
rntm_t single_thread() {
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    bli_rntm_disable_l3_sup(&rntm);
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

namespace {

// BLIS's typed micro-kernel signature (GEMM_UKR_PROT in blis.h).
template <class T>
using ukr_fn = void (*)(dim_t m, dim_t n, dim_t k, T* alpha, T* a, T* b, T* beta, T* c, inc_t rs_c, inc_t cs_c,
                        auxinfo_t* data, cntx_t* cntx);

template <class T>
struct Native {
    cntx_t* cntx;
    ukr_fn<T> ukr;
    dim_t mr, nr;
};

// Queried once: the context of the CPU BLIS detected (the same for every thread).
template <class T>
const Native<T>& native() {
    static const Native<T> n = [] {
        bli_init();
        cntx_t* cntx = const_cast<cntx_t*>(bli_gks_query_cntx());
        const num_t dt = sizeof(T) == 4 ? BLIS_FLOAT : BLIS_DOUBLE;
        return Native<T>{cntx, reinterpret_cast<ukr_fn<T>>(bli_cntx_get_l3_nat_ukr_dt(dt, BLIS_GEMM_UKR, cntx)),
                         bli_cntx_get_blksz_def_dt(dt, BLIS_MR, cntx), bli_cntx_get_blksz_def_dt(dt, BLIS_NR, cntx)};
    }();
    return n;
}

}  // namespace

template <class T>
MicroTile micro_tile() {
    return {native<T>().mr, native<T>().nr};
}

template <class T>
void packed_gemm(Index m_panels, Index n_panels, Index k, T alpha, const T* a, Index ps_a, const T* b, Index ps_b,
                 T beta, T* c, Index rs_c, Index cs_c, Index ts_m, Index ts_n, Ahead* ahead) {
    const Native<T>& n = native<T>();
    auxinfo_t aux{};
    bli_auxinfo_set_is_a(1, &aux);
    bli_auxinfo_set_is_b(1, &aux);
    // j outer: B_j stays in L1 while the A panels stream from L2.
    for (Index j = 0; j < n_panels; ++j) {
        T* bj = const_cast<T*>(b + j * ps_b);
        for (Index i = 0; i < m_panels; ++i) {
            const bool last_i = i + 1 == m_panels;
            bli_auxinfo_set_next_a(const_cast<T*>(a + (last_i ? 0 : i + 1) * ps_a), &aux);
            bli_auxinfo_set_next_b(last_i && j + 1 < n_panels ? bj + ps_b : bj, &aux);
            n.ukr(n.mr, n.nr, k, &alpha, const_cast<T*>(a + i * ps_a), bj, &beta, c + i * ts_m + j * ts_n, rs_c, cs_c,
                  &aux, n.cntx);
            if (ahead) ahead->step();
        }
    }
}

template MicroTile micro_tile<float>();
template MicroTile micro_tile<double>();
template void packed_gemm<float>(Index, Index, Index, float, const float*, Index, const float*, Index, float, float*,
                                 Index, Index, Index, Index, Ahead*);
template void packed_gemm<double>(Index, Index, Index, double, const double*, Index, const double*, Index, double,
                                  double*, Index, Index, Index, Index, Ahead*);


}  // namespace attn::detail
