// The only file that includes blis.h.
#include "gemm.hpp"

#include <blis.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "attn/error.hpp"

// Not in blis.h's exported API: the registry's context of one configuration. Debian's libblis.a has every
// configuration of the x86_64 family registered (cmake/FindBLIS.cmake links it statically for this reason); a
// configuration this build of BLIS lacks has no entry (nullptr).
extern "C" cntx_t** bli_gks_lookup_id(arch_t id);

namespace attn::detail {

namespace {

// The x86-64 configurations of BLIS 0.9.0 a CPU may run, best first within a class, and what each needs of the CPU
// (its kernels' instructions). knl and knc are left out (Xeon Phi).
enum class Needs { avx512, avx2_fma, fma3_avx, fma4_avx, avx, ssse3, nothing };
struct Configuration {
    arch_t id;
    int rank;  // 4: AVX-512, 3: AVX2 + FMA, 2: FMA3/FMA4 + AVX, 1: AVX, SSSE3; 0: the reference C kernels
    Needs needs;
};
bool cpu_has(Needs n) {
    __builtin_cpu_init();
    const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    switch (n) {
        case Needs::avx512:
            return avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
        case Needs::avx2_fma: return avx2_fma;
        case Needs::fma3_avx: return __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx");
        case Needs::fma4_avx: return __builtin_cpu_supports("fma4") && __builtin_cpu_supports("avx");
        case Needs::avx: return __builtin_cpu_supports("avx");
        case Needs::ssse3: return __builtin_cpu_supports("ssse3");
        case Needs::nothing: return true;
    }
    return false;
}
const std::vector<Configuration>& configurations() {
    static const std::vector<Configuration> all = {
        {BLIS_ARCH_SKX, 4, Needs::avx512},           {BLIS_ARCH_ZEN3, 3, Needs::avx2_fma},
        {BLIS_ARCH_ZEN2, 3, Needs::avx2_fma},        {BLIS_ARCH_ZEN, 3, Needs::avx2_fma},
        {BLIS_ARCH_HASWELL, 3, Needs::avx2_fma},     {BLIS_ARCH_EXCAVATOR, 2, Needs::fma3_avx},
        {BLIS_ARCH_STEAMROLLER, 2, Needs::fma3_avx}, {BLIS_ARCH_PILEDRIVER, 2, Needs::fma3_avx},
        {BLIS_ARCH_BULLDOZER, 2, Needs::fma4_avx},   {BLIS_ARCH_SANDYBRIDGE, 1, Needs::avx},
        {BLIS_ARCH_PENRYN, 1, Needs::ssse3},         {BLIS_ARCH_GENERIC, 0, Needs::nothing},
    };
    return all;
}

cntx_t* context_of(arch_t id) {
    cntx_t** registered = bli_gks_lookup_id(id);
    return registered ? registered[BLIS_NAT] : nullptr;
}
std::string name_of(arch_t id) { return bli_arch_string(id); }
int rank_of(arch_t id) {
    for (const Configuration& c : configurations())
        if (c.id == id) return c.rank;
    return 0;
}
bool prefers_rows(arch_t id, num_t dt) {
    return bli_cntx_l3_nat_ukr_prefers_rows_dt(dt, BLIS_GEMM_UKR, context_of(id));
}
bool is_amd() {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
}

// Registered in this BLIS and runnable on this CPU, in the order of configurations().
std::vector<arch_t> runnable_ids() {
    bli_init();
    std::vector<arch_t> ids;
    for (const Configuration& c : configurations())
        if (context_of(c.id) && cpu_has(c.needs)) ids.push_back(c.id);
    return ids;
}

// The best runnable configuration of the highest rank, optionally only those whose micro-kernel for dt stores C by
// rows; within the AVX2 rank zen3 on AMD, haswell elsewhere; BLIS's own pick where it is of that rank already (it
// knows the CPU; it falls short only on CPUs newer than it, such as Zen 5 -> generic, Sapphire Rapids -> haswell).
arch_t best(const std::vector<arch_t>& runnable, arch_t own, bool rows_only, num_t dt) {
    std::vector<arch_t> top;  // the candidates of the highest rank, in runnable's order
    for (arch_t id : runnable) {
        if (rows_only && !prefers_rows(id, dt)) continue;
        if (!top.empty() && rank_of(id) > rank_of(top.front())) top.clear();
        if (top.empty() || rank_of(id) == rank_of(top.front())) top.push_back(id);
    }
    if (top.empty()) return BLIS_ARCH_GENERIC;
    for (arch_t id : {own, is_amd() ? BLIS_ARCH_ZEN3 : BLIS_ARCH_HASWELL})
        if (std::find(top.begin(), top.end(), id) != top.end()) return id;
    return top.front();
}

struct Chosen {
    arch_t own;            // BLIS's pick for this CPU (or its BLIS_ARCH_TYPE)
    arch_t gemm;           // the general products (reference backend, backward, the bench's gemm)
    arch_t packed[2] = {BLIS_ARCH_GENERIC, BLIS_ARCH_GENERIC};  // the tiled kernel's micro-kernel, float and double
    bool own_packed = false;  // the library's own micro-kernels instead (microkernel_avx512.hpp); packed unused
    std::string reason;
    std::vector<arch_t> runnable;
};

const Chosen& chosen() {
    static const Chosen c = [] {
        Chosen r;
        // BLIS reads BLIS_ARCH_TYPE as a number at its initialisation and aborts the process on one it has no
        // context for, or faults on kernels the CPU lacks: checked first, as the library's own variable is.
        const char* blis_forced = std::getenv("BLIS_ARCH_TYPE");
        if (blis_forced && *blis_forced) {
            std::string names;
            bool ok = false;
            for (const Configuration& c : configurations())
                if (cpu_has(c.needs)) {
                    names += (names.empty() ? "" : ", ") + std::to_string(int(c.id)) + " (" + name_of(c.id) + ")";
                    ok = ok || std::to_string(int(c.id)) == blis_forced;
                }
            if (!ok)
                throw ConfigError("BLIS_ARCH_TYPE: '" + std::string(blis_forced) +
                                  "' is not the number of a BLIS configuration this CPU runs; choose one of " + names);
        }
        r.runnable = runnable_ids();
        r.own = bli_arch_query_id();
        const char* forced = std::getenv("ATTN_BLIS_ARCH");
        if (forced && *forced) {
            std::string names;
            for (arch_t id : r.runnable) {
                names += (names.empty() ? "" : ", ") + name_of(id);
                if (name_of(id) == forced) r.gemm = r.packed[0] = r.packed[1] = id, r.reason = "ATTN_BLIS_ARCH";
            }
            if (r.reason.empty())
                throw ConfigError("ATTN_BLIS_ARCH: '" + std::string(forced) +
                                  "' is not a BLIS configuration this CPU runs; choose one of " + names);
        } else if (blis_forced && *blis_forced) {
            r.gemm = r.packed[0] = r.packed[1] = r.own, r.reason = "BLIS_ARCH_TYPE";
        } else {
            r.gemm = best(r.runnable, r.own, false, BLIS_FLOAT);
            // With AVX-512 the tiled kernel's products run on the library's own row-storing AVX-512 micro-kernels
            // (the BLIS ones that store by rows are AVX2).
            r.own_packed = cpu_has(Needs::avx512);
            if (!r.own_packed) {
                r.packed[0] = best(r.runnable, r.own, true, BLIS_FLOAT);
                r.packed[1] = best(r.runnable, r.own, true, BLIS_DOUBLE);
            }
            r.reason = "chosen for this CPU";
        }
        return r;
    }();
    return c;
}

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

cntx_t* gemm_context(const char* configuration) {
    if (!configuration) return context_of(chosen().gemm);
    for (arch_t id : chosen().runnable)
        if (name_of(id) == configuration) return context_of(id);
    throw ConfigError("gemm: '" + std::string(configuration) + "' is not a BLIS configuration this CPU runs");
}

}  // namespace

std::string blis_version() { return bli_info_get_version_str(); }

template <>
void gemm<float>(bool ta, bool tb, Index m, Index n, Index k, float alpha, const float* a, Index rs_a, Index cs_a,
                 const float* b, Index rs_b, Index cs_b, float beta, float* c, Index rs_c, Index cs_c,
                 const char* configuration) {
    if (m == 0 || n == 0) return;
    rntm_t rntm = single_thread();
    bli_sgemm_ex(trans(ta), trans(tb), m, n, k, &alpha, const_cast<float*>(a), rs_a, cs_a, const_cast<float*>(b), rs_b,
                 cs_b, &beta, c, rs_c, cs_c, gemm_context(configuration), &rntm);
}

template <>
void gemm<double>(bool ta, bool tb, Index m, Index n, Index k, double alpha, const double* a, Index rs_a, Index cs_a,
                  const double* b, Index rs_b, Index cs_b, double beta, double* c, Index rs_c, Index cs_c,
                  const char* configuration) {
    if (m == 0 || n == 0) return;
    rntm_t rntm = single_thread();
    bli_dgemm_ex(trans(ta), trans(tb), m, n, k, &alpha, const_cast<double*>(a), rs_a, cs_a, const_cast<double*>(b),
                 rs_b, cs_b, &beta, c, rs_c, cs_c, gemm_context(configuration), &rntm);
}

namespace {

// BLIS's typed micro-kernel signature (GEMM_UKR_PROT in blis.h).
template <class T>
using ukr_fn = void (*)(dim_t m, dim_t n, dim_t k, T* alpha, T* a, T* b, T* beta, T* c, inc_t rs_c, inc_t cs_c,
                        auxinfo_t* data, cntx_t* cntx);

template <class T>
using own_fn = void (*)(Index k, T alpha, const T* a, const T* b, T beta, T* c, Index rs_c, Index cs_c);

template <class T>
struct Native {
    cntx_t* cntx;
    ukr_fn<T> ukr;
    dim_t mr, nr;
    own_fn<T> own = nullptr;  // the library's micro-kernel, when chosen (then cntx and ukr are unused)
};

// Queried once: the context chosen for T's micro-kernel (the same for every thread).
template <class T>
const Native<T>& native() {
    static const Native<T> n = [] {
        if (chosen().own_packed)
            return Native<T>{nullptr, nullptr, own_micro_kernel_rows, own_micro_kernel_columns<T>,
                             static_cast<own_fn<T>>(&own_micro_kernel_avx512)};
        cntx_t* cntx = context_of(chosen().packed[sizeof(T) == 4 ? 0 : 1]);
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
    if (n.own) {
        for (Index j = 0; j < n_panels; ++j)
            for (Index i = 0; i < m_panels; ++i) {
                n.own(k, alpha, a + i * ps_a, b + j * ps_b, beta, c + i * ts_m + j * ts_n, rs_c, cs_c);
                if (ahead) ahead->step();
            }
        return;
    }
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

template <class T>
void packed_blocked_gemm(Index m, Index n, Index k, const T* a, const T* b, T* c) {
    const MicroTile t = micro_tile<T>();
    const Index mr = t.mr, nr = t.nr;
    if (m < 0 || n < 0 || k < 0 || n % nr != 0)
        throw ConfigError("packed_blocked_gemm: n = " + std::to_string(n) + " must be a multiple of nr = " +
                          std::to_string(nr) + " (m = " + std::to_string(m) + ", k = " + std::to_string(k) + ")");
    // Blocks: B's kc x n in L3, an mc x kc block of A and a kc x nr panel of B in L2 (kc = 1024, mc = 8 mr: 384 KiB
    // and 128 KiB in float with 12 x 32 tiles). kc = 1024 measured 10-15% faster than BLIS's usual 256 on a Zen 5
    // at n = 2048 (the own micro-kernels load and store their C tile once per call).
    constexpr Index kc = 1024;
    const Index mc = 8 * mr;
    if (k == 0) std::fill_n(c, m * n, T(0));
    PackedBuffer<T> ap, bp, scratch;  // scratch: the C rows of a partial last row panel
    for (Index pc = 0; pc < k; pc += kc) {
        const Index kb = std::min(kc, k - pc);
        const T beta = pc == 0 ? T(0) : T(1);  // the first block writes C, the others add to it
        const Index ps_a = round_up(kb * mr, 16), ps_b = round_up(kb * nr, 16);
        T* bpan = bp.get(n / nr * ps_b);
        for (Index j = 0; j < n / nr; ++j)
            for (Index p = 0; p < kb; ++p)
                std::copy_n(b + (pc + p) * n + j * nr, nr, bpan + j * ps_b + p * nr);
        for (Index ic = 0; ic < m; ic += mc) {
            const Index mb = std::min(mc, m - ic), panels = (mb + mr - 1) / mr, full = mb / mr;
            T* apan = ap.get(panels * ps_a);
            for (Index i = 0; i < panels; ++i)
                for (Index p = 0; p < kb; ++p)
                    for (Index r = 0; r < mr; ++r) {
                        const Index row = ic + i * mr + r;
                        apan[i * ps_a + p * mr + r] = row < m ? a[row * k + pc + p] : T(0);
                    }
            packed_gemm<T>(full, n / nr, kb, T(1), apan, ps_a, bpan, ps_b, beta, c + ic * n, n, 1, mr * n, nr);
            if (full < panels) {  // rows ic + full * mr .. m: through mr scratch rows of C
                const Index r0 = ic + full * mr, rows = m - r0;
                T* tile = scratch.get(mr * n);
                if (pc > 0) std::copy_n(c + r0 * n, rows * n, tile);  // the rows past m are never read back
                packed_gemm<T>(1, n / nr, kb, T(1), apan + full * ps_a, ps_a, bpan, ps_b, beta, tile, n, 1, 0, nr);
                std::copy_n(tile, rows * n, c + r0 * n);
            }
        }
    }
}

template void packed_blocked_gemm<float>(Index, Index, Index, const float*, const float*, float*);
template void packed_blocked_gemm<double>(Index, Index, Index, const double*, const double*, double*);
template MicroTile micro_tile<float>();
template MicroTile micro_tile<double>();
template void packed_gemm<float>(Index, Index, Index, float, const float*, Index, const float*, Index, float, float*,
                                 Index, Index, Index, Index, Ahead*);
template void packed_gemm<double>(Index, Index, Index, double, const double*, Index, const double*, Index, double,
                                  double*, Index, Index, Index, Index, Ahead*);


}  // namespace attn::detail

namespace attn {

std::string BlisChoice::name() const {
    std::string n = gemm;
    if (packed_float != gemm) n += "+" + packed_float;
    if (packed_double != packed_float) n += "+" + packed_double;
    return n;
}

BlisChoice blis_choice() {
    const detail::Chosen& c = detail::chosen();
    BlisChoice b;
    b.own = detail::name_of(c.own);
    b.gemm = detail::name_of(c.gemm);
    b.packed_float = c.own_packed ? "attn_avx512" : detail::name_of(c.packed[0]);
    b.packed_double = c.own_packed ? "attn_avx512" : detail::name_of(c.packed[1]);
    b.reason = c.reason;
    for (arch_t id : c.runnable) b.runnable.push_back(detail::name_of(id));
    return b;
}

}  // namespace attn
