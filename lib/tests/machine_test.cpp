// attn/machine.hpp: SIMD target dispatch and the numerics fingerprint.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/machine.hpp"
#include "error_message.hpp"
#include "gemm.hpp"

using namespace attn;
using attn::test::error_message;

namespace {

std::vector<std::string> words(const std::string& s) {
    std::istringstream in(s);
    std::vector<std::string> out;
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

// Restores the best target when a test section ends, whatever it forced.
struct BestTargetAfter {
    ~BestTargetAfter() { force_simd_target(""); }
};

}  // namespace

TEST_CASE("the library compiles exactly the SIMD targets that ctest runs the tiled tests under", "[machine]") {
    // ATTN_SIMD_TARGETS (cmake/AttnHelpers.cmake) names a ctest test per target; a target Highway compiles but
    // ctest does not list would go untested.
    CHECK(simd_targets_compiled() == words(ATTN_SIMD_TARGETS_CMAKE));
}

TEST_CASE("the usable SIMD targets are the compiled ones this CPU runs, best first, ending in the fallback",
          "[machine]") {
    const std::vector<std::string> usable = simd_targets(), compiled = simd_targets_compiled();
    REQUIRE(!usable.empty());
    CHECK(usable.back() == compiled.back());  // the portable fallback runs everywhere
    std::size_t at = 0;
    for (const std::string& t : usable) {  // a subsequence of the compiled list: same order
        while (at < compiled.size() && compiled[at] != t) ++at;
        CHECK(at < compiled.size());
    }
    if (std::getenv("ATTN_SIMD_TARGET") == nullptr) CHECK(simd_target() == usable.front());
}

TEST_CASE("forcing a SIMD target changes the dispatched target and the fingerprint, and '' restores the best",
          "[machine]") {
    BestTargetAfter restore;
    force_simd_target("");
    const std::string best = simd_target();
    const std::string best_id = numerics_fingerprint().id();
    for (const std::string& t : simd_targets()) {
        force_simd_target(t);
        CHECK(simd_target() == t);
        const NumericsFingerprint f = numerics_fingerprint();
        CHECK(f.simd_chosen == t);
        CHECK((f.id() == best_id) == (t == best));
        // tiled still computes the same attention (closeness to reference is the tiled tests' job; here: it runs)
        Tensor<float> q({1, 1, 2, 4}), k({1, 1, 3, 4}), v({1, 1, 3, 2});
        for (Index i = 0; i < q.numel(); ++i) q[i] = 0.25f * float(i);
        for (Index i = 0; i < k.numel(); ++i) k[i] = 0.5f - 0.125f * float(i);
        for (Index i = 0; i < v.numel(); ++i) v[i] = float(i);
        SdpaOptions o;
        o.backend = Backend::Tiled;
        const auto out = scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, o).output;
        for (Index i = 0; i < out.numel(); ++i) CHECK(std::isfinite(out[i]));
    }
    force_simd_target("best");
    CHECK(simd_target() == best);
    CHECK(numerics_fingerprint().id() == best_id);
}

TEST_CASE("SCALAR and EMU128 both force the portable fallback, whichever of the two this build compiled",
          "[machine]") {
    // The g++ build has SCALAR, the clang (fuzz) build EMU128; ATTN_SIMD_TARGET=SCALAR must reach both.
    BestTargetAfter restore;
    const std::string fallback = simd_targets().back();
    for (const char* name : {"SCALAR", "EMU128"}) {
        CHECK(is_compiled_simd_target(name));
        force_simd_target(name);
        CHECK(simd_target() == fallback);
    }
}

TEST_CASE("an unknown or unsupported SIMD target is a ConfigError that lists the choices", "[machine][errors]") {
    BestTargetAfter restore;
    const std::string msg = error_message<ConfigError>([] { force_simd_target("NEON"); });
    CHECK_THAT(msg, Catch::Contains("force_simd_target: 'NEON'"));
    CHECK_THAT(msg, Catch::Contains(simd_targets().front()));
    CHECK_FALSE(is_compiled_simd_target("NEON"));
}

TEST_CASE("the numerics fingerprint names the machine, and its id is stable and ignores the thread count",
          "[machine]") {
    const NumericsFingerprint a = numerics_fingerprint(), b = numerics_fingerprint();
    CHECK(a.id() == b.id());
    for (const auto& [name, value] : a.fields()) {
        INFO(name);
        CHECK(!value.empty());
    }
    CHECK(a.simd_chosen == simd_target());
    CHECK(!a.blis_arch.empty());
    NumericsFingerprint c = a;
    c.threads = a.threads + 7;
    CHECK(c.id() == a.id());
    c.blis_arch += "x";
    CHECK(c.id() != a.id());
    // file-name safe: lower-case letters, digits, '-' and '_'
    for (char ch : a.id()) CHECK(((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_'));
}

TEST_CASE("the fingerprint's id is the documented hash", "[machine]") {
    // (Its cpu field, /proc/cpuinfo's vendor and model name, is checked by the property
    // the_forced_simd_target_is_the_one_fingerprinted.)
    const NumericsFingerprint a = numerics_fingerprint();
    // The id: lower-case "<blis_arch>-<simd_chosen>-" ('+' of blis_arch as '_') and the top 32 bits of FNV-1a (64-bit) over "name=value\n"
    // of every field but threads, in hex.
    std::uint64_t h = 1469598103934665603ull;
    for (const auto& [name, value] : a.fields())
        if (name != "threads")
            for (char ch : name + "=" + value + "\n") h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08llx", static_cast<unsigned long long>(h >> 32));
    std::string prefix = a.blis_arch + "-" + a.simd_chosen;
    for (char& ch : prefix) ch = ch == '+' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    CHECK(a.id() == prefix + "-" + hex);
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

// ctest runs this file without ATTN_BLIS_ARCH and BLIS_ARCH_TYPE (the choice is the library's own).
TEST_CASE("the BLIS configurations are the best this CPU runs, fingerprinted", "[machine]") {
    REQUIRE(std::getenv("ATTN_BLIS_ARCH") == nullptr);
    REQUIRE(std::getenv("BLIS_ARCH_TYPE") == nullptr);
    const BlisChoice c = blis_choice();
    CHECK(c.reason == "chosen for this CPU");
    REQUIRE(!c.runnable.empty());
    CHECK(c.runnable.back() == "generic");  // the reference C kernels run everywhere, ranked last
    for (const std::string& name : {c.gemm, c.own}) CHECK(contains(c.runnable, name));
    // The tiled kernel's: a BLIS configuration, or with AVX-512 (skx runnable) the library's own.
    for (const std::string& name : {c.packed_float, c.packed_double})
        CHECK((contains(c.runnable, name) || (name == "attn_avx512" && contains(c.runnable, "skx"))));
    // BLIS's own pick may be its reference kernels (CPUs newer than BLIS); the library's never is where the CPU
    // runs better ones.
    if (c.runnable.size() > 1) CHECK(c.gemm != "generic");
    if (c.runnable.size() > 1) CHECK(c.packed_float != "generic");
    // With AVX-512, skx for the general products; its micro-kernels store their tile by columns, so never skx for
    // the tiled kernel's.
    if (contains(c.runnable, "skx")) {
        CHECK(c.gemm == "skx");
        CHECK(c.packed_float == "attn_avx512");
        CHECK(c.packed_double == "attn_avx512");
    }
    CHECK(numerics_fingerprint().blis_arch == c.name());
    CHECK(c.name().rfind(c.gemm, 0) == 0);
    CHECK((c.name() == c.gemm) == (c.packed_float == c.gemm && c.packed_double == c.gemm));
}

TEST_CASE("the measured limit is the fastest gemm among the runnable configurations", "[machine]") {
    const BlisChoice c = blis_choice();
    const MachineLimit m = measure_machine_limit(96, 1);
    REQUIRE(m.configurations.size() == c.runnable.size());
    for (std::size_t i = 0; i < m.configurations.size(); ++i) {
        CHECK(m.configurations[i].configuration == c.runnable[i]);
        CHECK(m.configurations[i].sgemm_gflops > 0);
        CHECK(m.configurations[i].sgemm_gflops <= m.fastest_sgemm.sgemm_gflops);
        CHECK(m.configurations[i].dgemm_gflops <= m.fastest_dgemm.dgemm_gflops);
    }
    CHECK(m.chosen.configuration == c.gemm);
    CHECK(m.own.configuration == c.own);
    // The packed products count too: the limit is the fastest of everything measured.
    CHECK(m.packed.configuration == "packed");
    CHECK(m.packed.sgemm_gflops > 0);
    CHECK(m.packed.dgemm_gflops > 0);
    CHECK(m.limit_sgemm.sgemm_gflops == std::max(m.fastest_sgemm.sgemm_gflops, m.packed.sgemm_gflops));
    CHECK(m.limit_dgemm.dgemm_gflops == std::max(m.fastest_dgemm.dgemm_gflops, m.packed.dgemm_gflops));
    CHECK(m.peak_fma_float_gflops > 0);
    CHECK(m.peak_fma_double_gflops > 0);
}

TEMPLATE_TEST_CASE("the limit's packed gemm is a product within its rounding bound, partial blocks included",
                   "[machine]", float, double) {
    // m spans two row blocks (8 mr rows each) and ends in a partial panel; k spans two kc = 1024 blocks, the second
    // partial; n is two of the widest nr. Each element is a sum of k exact FMA products with at most k - 1
    // roundings inside the blocks and one per block into C: |c - exact| <= gamma_(k+2) sum |a||b| (Higham's bound,
    // gamma_j = j u / (1 - j u)), against a long double product.
    const Index mr = detail::micro_tile<TestType>().mr;
    const Index m = 16 * mr + 5, n = 64, k = 1100;
    std::vector<TestType> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
        c(static_cast<std::size_t>(m * n), TestType(7));
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (auto& x : a) x = static_cast<TestType>(u(rng));
    for (auto& x : b) x = static_cast<TestType>(u(rng));
    detail::packed_blocked_gemm<TestType>(m, n, k, a.data(), b.data(), c.data());
    const double unit = std::numeric_limits<TestType>::epsilon() / 2;
    const double gamma = (k + 2) * unit / (1 - (k + 2) * unit);
    Index over = 0;
    for (Index i = 0; i < m; ++i)
        for (Index j = 0; j < n; ++j) {
            long double exact = 0, magnitude = 0;
            for (Index p = 0; p < k; ++p) {
                exact += static_cast<long double>(a[i * k + p]) * b[p * n + j];
                magnitude += std::fabs(static_cast<long double>(a[i * k + p]) * b[p * n + j]);
            }
            if (std::fabs(static_cast<long double>(c[i * n + j]) - exact) > gamma * magnitude) ++over;
        }
    CHECK(over == 0);
    CHECK_THROWS_AS(detail::packed_blocked_gemm<TestType>(m, n + 1, k, a.data(), b.data(), c.data()), ConfigError);
}

// ATTN_BLIS_ARCH and BLIS_ARCH_TYPE, read once at the first BLIS call: each test in a process of its own (ctest:
// attn_machine_env_blis_*_test; hidden otherwise), started without either, setting one before anything runs.
TEST_CASE("ATTN_BLIS_ARCH forces one configuration for every product", "[.env-blis-forced]") {
    REQUIRE(std::getenv("ATTN_BLIS_ARCH") == nullptr);
    setenv("ATTN_BLIS_ARCH", "generic", 1);
    const BlisChoice c = blis_choice();
    CHECK(c.reason == "ATTN_BLIS_ARCH");
    CHECK(c.gemm == "generic");
    CHECK(c.packed_float == "generic");
    CHECK(c.packed_double == "generic");
    CHECK(c.name() == "generic");
    CHECK(numerics_fingerprint().id().rfind("generic-", 0) == 0);
}

TEST_CASE("BLIS_ARCH_TYPE keeps BLIS's numbering and forces that configuration everywhere", "[.env-blis-type]") {
    REQUIRE(std::getenv("BLIS_ARCH_TYPE") == nullptr);
    setenv("BLIS_ARCH_TYPE", "25", 1);  // BLIS_ARCH_GENERIC in BLIS 0.9.0
    const BlisChoice c = blis_choice();
    CHECK(c.reason == "BLIS_ARCH_TYPE");
    CHECK(c.own == "generic");
    CHECK(c.name() == "generic");
}

TEST_CASE("a BLIS_ARCH_TYPE BLIS has no context for is a ConfigError, not BLIS's abort", "[.env-blis-type-unknown]") {
    REQUIRE(std::getenv("BLIS_ARCH_TYPE") == nullptr);
    setenv("BLIS_ARCH_TYPE", "13", 1);  // BLIS_ARCH_ARMSVE: no context in an x86-64 build
    const std::string message = error_message<ConfigError>([] { (void)blis_choice(); });
    CHECK(message.find("BLIS_ARCH_TYPE: '13'") != std::string::npos);
    CHECK(message.find("25 (generic)") != std::string::npos);
    setenv("BLIS_ARCH_TYPE", "generic", 1);  // BLIS would read 0 (skx)
    CHECK(error_message<ConfigError>([] { (void)blis_choice(); }).find("BLIS_ARCH_TYPE: 'generic'") !=
          std::string::npos);
}

TEST_CASE("an unknown ATTN_BLIS_ARCH is a ConfigError naming the variable and the choices", "[.env-blis-unknown]") {
    REQUIRE(std::getenv("ATTN_BLIS_ARCH") == nullptr);
    setenv("ATTN_BLIS_ARCH", "zen9", 1);
    const std::string message = error_message<ConfigError>([] { (void)blis_choice(); });
    CHECK(message.find("ATTN_BLIS_ARCH: 'zen9'") != std::string::npos);
    CHECK(message.find("generic") != std::string::npos);  // the list of choices
    // The same from an attention call, reference and tiled, and again on a second call (never a half-made choice).
    Tensor<float> q({1, 1, 2, 4}, 0.5f), k({1, 1, 3, 4}, 0.25f), v({1, 1, 3, 4}, 1.0f);
    for (Backend backend : {Backend::Reference, Backend::Tiled, Backend::Reference}) {
        SdpaOptions options;
        options.backend = backend;
        const std::string m = error_message<ConfigError>(
            [&] { (void)scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options); });
        CHECK(m.find("ATTN_BLIS_ARCH: 'zen9'") != std::string::npos);
    }
}

// The environment's SIMD target, read by the library itself at its first dispatch. Each test runs in a process of
// its own (ctest: attn_machine_env_*_test; hidden otherwise), started without ATTN_SIMD_TARGET so that this file's
// main forces nothing: the test sets the variable before anything dispatches.
TEST_CASE("ATTN_SIMD_TARGET forces the target at the first dispatch", "[.env-applies]") {
    REQUIRE(std::getenv("ATTN_SIMD_TARGET") == nullptr);
    setenv("ATTN_SIMD_TARGET", "SCALAR", 1);
    const std::string got = simd_target();  // the first dispatch of this process
    CHECK((got == "SCALAR" || got == "EMU128"));
}

TEST_CASE("ATTN_SIMD_TARGET cannot override a target the program forced first", "[.env-forced-first]") {
    REQUIRE(std::getenv("ATTN_SIMD_TARGET") == nullptr);
    setenv("ATTN_SIMD_TARGET", "SCALAR", 1);
    const std::vector<std::string> usable = simd_targets();
    REQUIRE(!usable.empty());
    force_simd_target(usable.front());
    // The first dispatch of this process.
    Tensor<float> q({1, 1, 2, 4}, 0.5f), k({1, 1, 3, 4}, 0.25f), v({1, 1, 3, 4}, 1.0f);
    SdpaOptions options;
    options.backend = Backend::Tiled;
    (void)scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    CHECK(simd_target() == usable.front());
}
