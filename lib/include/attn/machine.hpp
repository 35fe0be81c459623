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

// What decides the bits of a computation on this machine. Same fingerprint, same binary, same inputs: bitwise
// the same results (whatever the thread count). A different fingerprint may round differently; every error
// bound still holds, so bound checks are machine-independent and drift checks compare only equal fingerprints.
struct NumericsFingerprint {
    std::string cpu;             // vendor, model name, family/model/stepping (/proc/cpuinfo)
    std::string simd_supported;  // simd_targets(), space-separated
    std::string simd_chosen;     // simd_target()
    std::string blis_version;
    std::string blis_arch;       // the configuration BLIS chose at run time (its micro-kernels)
    std::string compiler;        // compiler id and version the library was built with
    std::string flags;           // the library's compile flags (build type flags, -march if any)
    std::string libc;            // the C library version (its exp is the reference backend's)
    int threads = 1;             // OpenMP's default thread count (informational: it does not change the bits)

    // A stable, file-name-safe id of the fields that decide the bits (all but threads):
    // "<blis_arch>-<simd_chosen>-<8 hex digits of a 64-bit FNV-1a hash>", e.g. "skx-avx3_dl-1f0c9a7e".
    std::string id() const;
    // (name, value) pairs in a fixed order, for `attn info` and the reports.
    std::vector<std::pair<std::string, std::string>> fields() const;
};

// The fingerprint of this process now (simd_chosen follows force_simd_target).
NumericsFingerprint numerics_fingerprint();

}  // namespace attn
