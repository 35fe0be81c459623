// The machine's measured limit (attn/machine.hpp): each runnable BLIS configuration's square gemm, and the peak FMA
// rate of the widest vectors this CPU has.
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <vector>

#include "attn/machine.hpp"
#include "gemm.hpp"

namespace attn {

namespace {

double thread_seconds() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Best of `repetitions` timed n x n x n products after one untimed one, GFLOP/s on the calling thread's CPU time:
// product(a, b, c) one BLIS configuration's gemm or the library's packed products.
template <class T, class Product>
double gflops_of(long n, int repetitions, Product product) {
    std::vector<T> a(static_cast<std::size_t>(n * n)), b(a.size()), c(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        a[i] = static_cast<T>(double(i % 97) / 97.0 - 0.5);
        b[i] = static_cast<T>(double(i % 89) / 89.0 - 0.5);
    }
    double best = 0;
    for (int r = 0; r <= repetitions; ++r) {
        const double t0 = thread_seconds();
        product(a.data(), b.data(), c.data());
        const double s = thread_seconds() - t0;
        if (r > 0 && s > 0) best = std::max(best, 2.0 * double(n) * double(n) * double(n) / s / 1e9);
    }
    return best;
}

template <class T>
double gemm_gflops(const std::string& configuration, long n, int repetitions) {
    return gflops_of<T>(n, repetitions, [&](const T* a, const T* b, T* c) {
        detail::gemm<T>(false, false, n, n, n, T(1), a, n, 1, b, n, 1, T(0), c, n, 1, configuration.c_str());
    });
}

// The library's packed products (gemm.hpp, packed_blocked_gemm).
template <class T>
double packed_gflops(long n, int repetitions) {
    return gflops_of<T>(n, repetitions,
                        [&](const T* a, const T* b, T* c) { detail::packed_blocked_gemm<T>(n, n, n, a, b, c); });
}

// Peak FMA: 16 independent accumulators (more than latency x ports on every x86-64 core), `steps` rounds, best of
// three. One function per width, each compiled for its instructions (a lambda would not inherit the target).
constexpr long steps = 4'000'000;

#define ATTN_PEAK_LOOP(V, E, lanes, set1, fma, store, out)                                                     \
    {                                                                                                       \
        double best = 0;                                                                                    \
        for (int r = 0; r < 3; ++r) {                                                                       \
            V acc[16];                                                                                      \
            for (int i = 0; i < 16; ++i) acc[i] = set1(1.0 + 0.001 * i); /* unequal: no chain merges */    \
            const V x = set1(0.999999), y = set1(1e-7);                                                     \
            const double t0 = thread_seconds();                                                             \
            for (long s = 0; s < steps; ++s)                                                                \
                for (V & v : acc) v = fma(v, x, y);                                                         \
            const double secs = thread_seconds() - t0;                                                      \
            alignas(64) E lane[lanes];                                                                      \
            volatile double sink = 0;                                                                       \
            for (V & v : acc) { store(lane, v); sink = sink + double(lane[0]); }                             \
            if (secs > 0) best = std::max(best, 2.0 * (lanes) * 16 * double(steps) / secs / 1e9);           \
        }                                                                                                   \
        *(out) = best;                                                                                      \
    }

#define ATTN_MUL_ADD_PS(a, b, c) _mm_add_ps(_mm_mul_ps(a, b), c)
#define ATTN_MUL_ADD_PD(a, b, c) _mm_add_pd(_mm_mul_pd(a, b), c)
#define ATTN_SET1_512_PS(x) _mm512_set1_ps(float(x))
#define ATTN_SET1_256_PS(x) _mm256_set1_ps(float(x))
#define ATTN_SET1_128_PS(x) _mm_set1_ps(float(x))

__attribute__((target("avx512f"))) void peak_avx512(double* f, double* d) {
    ATTN_PEAK_LOOP(__m512, float, 16, ATTN_SET1_512_PS, _mm512_fmadd_ps, _mm512_store_ps, f)
    ATTN_PEAK_LOOP(__m512d, double, 8, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_store_pd, d)
}
__attribute__((target("avx2,fma"))) void peak_avx2(double* f, double* d) {
    ATTN_PEAK_LOOP(__m256, float, 8, ATTN_SET1_256_PS, _mm256_fmadd_ps, _mm256_store_ps, f)
    ATTN_PEAK_LOOP(__m256d, double, 4, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_store_pd, d)
}
// No FMA: a multiply and an add per lane and step (SSE2, every x86-64 CPU).
void peak_sse2(double* f, double* d) {
    ATTN_PEAK_LOOP(__m128, float, 4, ATTN_SET1_128_PS, ATTN_MUL_ADD_PS, _mm_store_ps, f)
    ATTN_PEAK_LOOP(__m128d, double, 2, _mm_set1_pd, ATTN_MUL_ADD_PD, _mm_store_pd, d)
}

}  // namespace

MachineLimit measure_machine_limit(long n, int repetitions) {
    MachineLimit m;
    m.n = n;
    const BlisChoice choice = blis_choice();
    for (const std::string& name : choice.runnable) {
        GemmSpeed g{name, gemm_gflops<float>(name, n, repetitions), gemm_gflops<double>(name, n, repetitions)};
        if (g.sgemm_gflops > m.fastest_sgemm.sgemm_gflops) m.fastest_sgemm = g;
        if (g.dgemm_gflops > m.fastest_dgemm.dgemm_gflops) m.fastest_dgemm = g;
        if (name == choice.gemm) m.chosen = g;
        if (name == choice.own) m.own = g;
        m.configurations.push_back(g);
    }
    // n a multiple of nr (32, 16 or 8 on every configuration); the bench's n = 2048 and info's 1024 are.
    const long nr = static_cast<long>(std::max(detail::micro_tile<float>().nr, detail::micro_tile<double>().nr));
    const long np = std::max(nr, n / nr * nr);
    m.packed = {"packed", packed_gflops<float>(np, repetitions), packed_gflops<double>(np, repetitions)};
    m.limit_sgemm = m.packed.sgemm_gflops > m.fastest_sgemm.sgemm_gflops ? m.packed : m.fastest_sgemm;
    m.limit_dgemm = m.packed.dgemm_gflops > m.fastest_dgemm.dgemm_gflops ? m.packed : m.fastest_dgemm;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        m.fma_width = "avx512";
        peak_avx512(&m.peak_fma_float_gflops, &m.peak_fma_double_gflops);
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        m.fma_width = "avx2";
        peak_avx2(&m.peak_fma_float_gflops, &m.peak_fma_double_gflops);
    } else {
        m.fma_width = "sse2";
        peak_sse2(&m.peak_fma_float_gflops, &m.peak_fma_double_gflops);
    }
    return m;
}

}  // namespace attn
