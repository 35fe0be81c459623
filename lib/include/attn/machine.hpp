// attn/machine.hpp: what decides the bits on this machine: the SIMD target the tiled kernel runs, and the numerics
// fingerprint that names the machine a result (report, baseline, benchmark, fuzz log) was made on.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace attn {

// Highway targets compiled into the library that this CPU can run, best first, by Highway's names
// (e.g. {"AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"} on a Sapphire Rapids; the last is the portable
// fallback and always present: SCALAR when g++ < 12.3 built the library, EMU128 otherwise).
std::vector<std::string> simd_targets();

// Every Highway target compiled into the library, best first, whether or not this CPU can run it.
std::vector<std::string> simd_targets_compiled();

// Whether `name` names a target compiled into the library (either fallback spelling counts), whether or not this
// CPU can run it.
bool is_compiled_simd_target(const std::string& name);

// The target the tiled kernel dispatches to now: the best of simd_targets(), or the forced one.
std::string simd_target();

// Makes the tiled kernel run `name` (one of simd_targets()) from now on, so that an AVX-512 machine can check the
// AVX2 path a laptop takes; "" or "best" restores the best; "SCALAR" and "EMU128" both mean the portable fallback
// (whichever this build has). Other names throw ConfigError listing the choices.
// Not thread-safe: call it before starting threads that run attention. The environment variable
// ATTN_SIMD_TARGET=<name> does the same before the first call of the tiled kernel (ctest, the CLI, the suite).
void force_simd_target(const std::string& name);

// The BLIS configurations (micro-kernels, so speed and bits) the library runs, chosen once per process. By default
// the best this CPU runs, not BLIS's own pick, which falls back to its reference C kernels on CPUs newer than it
// (Zen 5 -> generic) or leaves AVX-512 unused (Sapphire Rapids -> haswell): the general products (reference
// backend, backward) take the highest-ranked one (AVX-512 > AVX2+FMA > FMA3 > AVX > SSSE3 > generic; BLIS's own
// pick within the top rank, else zen3 on AMD, haswell elsewhere); the tiled kernel's micro-kernel, which stores its
// tile by rows where skx's store by columns, is the library's own with AVX-512 ("attn_avx512": the sums of BLIS's
// row-storing AVX2 kernels, in their order, at twice the width), else the highest-ranked BLIS one that stores by
// rows. ATTN_BLIS_ARCH=<name> (one of runnable) forces one BLIS configuration for all of them; BLIS's own
// BLIS_ARCH_TYPE does the same with BLIS's numbering.
struct BlisChoice {
    std::string gemm, packed_float, packed_double;
    std::string own;                    // BLIS's own pick for this CPU (bli_arch_query_id)
    std::string reason;                 // "chosen for this CPU", "ATTN_BLIS_ARCH" or "BLIS_ARCH_TYPE"
    std::vector<std::string> runnable;  // every configuration of this BLIS this CPU runs
    // "skx+attn_avx512": gemm, then the micro-kernel's where it differs ("zen3" when all are one).
    std::string name() const;
};
BlisChoice blis_choice();

// The machine's limit for one thread, measured: the fastest square gemm (n^3, one thread, CPU time) among the BLIS
// configurations this CPU runs and the library's packed products (its tiled kernels' micro-kernels in a blocked
// gemm, which on AVX-512 are the library's own and may beat every BLIS configuration), and the peak FMA rate of its
// widest vectors (independent chains, no memory).
struct GemmSpeed {
    std::string configuration;
    double sgemm_gflops = 0, dgemm_gflops = 0;
};
struct MachineLimit {
    long n = 0;
    std::vector<GemmSpeed> configurations;  // in BlisChoice::runnable's order
    GemmSpeed fastest_sgemm, fastest_dgemm, chosen, own;  // among the BLIS configurations
    GemmSpeed packed;                                     // configuration "packed": detail::packed_blocked_gemm
    GemmSpeed limit_sgemm, limit_dgemm;                   // the fastest of all: fastest_* or packed
    std::string fma_width;  // "avx512", "avx2" or "sse2"
    double peak_fma_float_gflops = 0, peak_fma_double_gflops = 0;
};
MachineLimit measure_machine_limit(long n = 2048, int repetitions = 2);

// What decides the bits of a computation on this machine. Same fingerprint, same binary, same inputs: bitwise
// the same results (whatever the thread count). A different fingerprint may round differently; every error
// bound still holds, so bound checks are machine-independent and drift checks compare only equal fingerprints.
struct NumericsFingerprint {
    std::string cpu;             // vendor, model name, family/model/stepping (/proc/cpuinfo)
    std::string simd_supported;  // simd_targets(), space-separated
    std::string simd_chosen;     // simd_target()
    std::string blis_version;
    std::string blis_arch;       // the BLIS configurations the library runs: blis_choice().name()
    std::string compiler;        // compiler id and version the library was built with
    std::string flags;           // the library's compile flags (build type flags, -march if any)
    std::string libc;            // the C library version (its exp is the reference backend's)
    int threads = 1;             // OpenMP's default thread count (informational: it does not change the bits)

    // A stable, file-name-safe id of the fields that decide the bits (all but threads):
    // "<blis_arch>-<simd_chosen>-<8 hex digits of a 64-bit FNV-1a hash>", lower case, '+' as '_', e.g.
    // "skx_zen3-avx3_dl-1f0c9a7e".
    std::string id() const;
    // (name, value) pairs in a fixed order, for `attn info` and the reports.
    std::vector<std::pair<std::string, std::string>> fields() const;
};

// The fingerprint of this process now (simd_chosen follows force_simd_target).
NumericsFingerprint numerics_fingerprint();

}  // namespace attn
