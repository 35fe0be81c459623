// The 16-bit storage types: every pattern decodes to the value its format defines, rounding is to nearest with
// ties to even in one step (checked against a search over all finite values, and against the compiler's _Float16
// where it has one), overflow, NaN and subnormals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attn/half.hpp"

using namespace attn;

namespace {

// The value of a pattern from the format's definition alone (sign, biased exponent, significand), with ldexp.
double defined_value(std::uint16_t h, int E, int M) {
    const int bias = (1 << (E - 1)) - 1;
    const int exponent = (h >> M) & ((1 << E) - 1);
    const int significand = h & ((1 << M) - 1);
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    if (exponent == (1 << E) - 1)
        return significand ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
    if (exponent == 0) return sign * std::ldexp(significand, 1 - bias - M);
    return sign * std::ldexp(significand + (1 << M), exponent - bias - M);
}

// Round to nearest, ties to even, by search: among the non-negative finite patterns (ascending in value as in bits),
// the nearest to |x|; a tie goes to the even pattern; beyond the largest finite value by half an ulp or more, inf.
template <class H>
std::uint16_t nearest_by_search(double x, int E, int M) {
    static const std::vector<double> values = [&] {
        std::vector<double> v;
        const std::uint16_t inf = static_cast<std::uint16_t>(((1u << E) - 1) << M);
        for (std::uint32_t b = 0; b < inf; ++b) v.push_back(defined_value(static_cast<std::uint16_t>(b), E, M));
        return v;
    }();
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    const double largest = values.back();
    const double ulp_top = largest - values[values.size() - 2];
    if (a >= largest + ulp_top / 2) return sign | static_cast<std::uint16_t>(values.size());  // inf pattern
    const auto hi = std::lower_bound(values.begin(), values.end(), a);
    if (hi == values.end()) return sign | static_cast<std::uint16_t>(values.size() - 1);
    if (*hi == a || hi == values.begin()) return sign | static_cast<std::uint16_t>(hi - values.begin());
    const auto lo = hi - 1;
    const double dlo = a - *lo, dhi = *hi - a;
    const auto ilo = static_cast<std::uint16_t>(lo - values.begin()), ihi = static_cast<std::uint16_t>(hi - values.begin());
    if (dlo < dhi) return sign | ilo;
    if (dhi < dlo) return sign | ihi;
    return sign | ((ilo & 1) ? ihi : ilo);
}

template <class H>
void check_format(int E, int M) {
    // Every pattern decodes to its defined value; every non-NaN pattern survives float -> H.
    for (std::uint32_t b = 0; b <= 0xffff; ++b) {
        const auto h = H::from_bits(static_cast<std::uint16_t>(b));
        const double defined = defined_value(h.bits, E, M);
        const float f = h;
        if (std::isnan(defined)) {
            REQUIRE(std::isnan(f));
            REQUIRE(std::isnan(static_cast<float>(H(f))));
            REQUIRE(std::signbit(f) == bool(b & 0x8000));
            continue;
        }
        REQUIRE(static_cast<double>(f) == defined);
        REQUIRE(std::signbit(f) == bool(b & 0x8000));
        REQUIRE(H(f).bits == h.bits);
        REQUIRE(H(static_cast<double>(f)).bits == h.bits);
    }
    // Every midpoint between neighbours (the ties), and a double ulp either side of it.
    const std::uint16_t inf = static_cast<std::uint16_t>(((1u << E) - 1) << M);
    for (std::uint32_t b = 0; b + 1 <= inf; ++b) {
        const double lo = defined_value(static_cast<std::uint16_t>(b), E, M);
        const double hi = b + 1 == inf ? lo + (lo - defined_value(static_cast<std::uint16_t>(b - 1), E, M))
                                       : defined_value(static_cast<std::uint16_t>(b + 1), E, M);
        const double mid = lo + (hi - lo) / 2;
        for (const double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300)})
            for (const double s : {x, -x}) {
                INFO("x = " << s << " between patterns " << b << " and " << b + 1);
                REQUIRE(H(s).bits == nearest_by_search<H>(s, E, M));
            }
    }
    // Random doubles over the whole range, from below half the smallest subnormal to past the overflow threshold.
    std::mt19937_64 rng(20261202);
    std::uniform_int_distribution<int> exponent(-(1 << (E - 1)) - M - 4, (1 << (E - 1)) + 2);
    std::uniform_real_distribution<double> significand(1.0, 2.0);
    for (int i = 0; i < 200000; ++i) {
        const double x = std::ldexp(significand(rng), exponent(rng)) * (i % 2 ? -1 : 1);
        INFO("x = " << x);
        REQUIRE(H(x).bits == nearest_by_search<H>(x, E, M));
        REQUIRE(H(static_cast<float>(x)).bits == nearest_by_search<H>(static_cast<float>(x), E, M));
    }
}

}  // namespace

TEST_CASE("float16 decodes every pattern and rounds to nearest even in one step", "[half]") {
    check_format<float16>(5, 10);
    CHECK(static_cast<float>(float16(65519.99)) == 65504.0f);
    CHECK(std::isinf(static_cast<float>(float16(65520.0))));
    CHECK(float16(std::ldexp(1.0, -25)).bits == 0);                               // tie to even: 0
    CHECK(float16(std::nextafter(std::ldexp(1.0, -25), 1.0)).bits == 1);          // just above: smallest subnormal
    CHECK(float16(-0.0).bits == 0x8000);
    // One step from the double: 1 + 2^-11 + 2^-40 rounds up, though rounding to float first (1 + 2^-11, a tie)
    // and then to float16 would give 1.
    CHECK(float16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)).bits == 0x3c01);
    CHECK(float16(static_cast<float>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40))).bits == 0x3c00);
}

TEST_CASE("bfloat16 decodes every pattern and rounds to nearest even, not by truncation", "[half]") {
    check_format<bfloat16>(8, 7);
    // 1 + 3 * 2^-9 lies 3/4 of the way from 1 to the next bfloat16, 1 + 2^-7: nearest gives that, truncation 1.
    CHECK(static_cast<float>(bfloat16(1.0f + 3 * std::ldexp(1.0f, -9))) == 1.0f + std::ldexp(1.0f, -7));
    CHECK(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::max()))));
    CHECK(static_cast<float>(bfloat16(std::numeric_limits<float>::min())) == std::numeric_limits<float>::min());
}

TEST_CASE("numeric_limits of the storage types are those of their formats", "[half]") {
    CHECK(static_cast<float>(std::numeric_limits<float16>::max()) == 65504.0f);
    CHECK(static_cast<float>(std::numeric_limits<float16>::min()) == std::ldexp(1.0f, -14));
    CHECK(static_cast<float>(std::numeric_limits<float16>::denorm_min()) == std::ldexp(1.0f, -24));
    CHECK(static_cast<float>(std::numeric_limits<float16>::epsilon()) == std::ldexp(1.0f, -10));
    CHECK(std::isnan(static_cast<float>(std::numeric_limits<float16>::quiet_NaN())));
    CHECK(static_cast<float>(std::numeric_limits<bfloat16>::max()) == 0x1.fep127f);
    CHECK(static_cast<float>(std::numeric_limits<bfloat16>::min()) == std::numeric_limits<float>::min());
    CHECK(static_cast<float>(std::numeric_limits<bfloat16>::denorm_min()) == std::ldexp(1.0f, -133));
    CHECK(static_cast<float>(std::numeric_limits<bfloat16>::epsilon()) == std::ldexp(1.0f, -7));
    CHECK(std::isinf(static_cast<float>(std::numeric_limits<bfloat16>::infinity())));
    STATIC_REQUIRE(std::numeric_limits<float16>::digits == 11);
    STATIC_REQUIRE(std::numeric_limits<bfloat16>::digits == 8);
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 (g++ on x86-64) rounds from float by the same rule: every 2^20-th float and a dense run
// around the subnormal and overflow thresholds.
TEST_CASE("float16 rounds floats as the compiler's _Float16 does", "[half]") {
    const auto check = [](std::uint32_t bits) {
        const float f = std::bit_cast<float>(bits);
        const _Float16 h = static_cast<_Float16>(f);
        if (std::isnan(f)) return;
        REQUIRE(float16(f).bits == std::bit_cast<std::uint16_t>(h));
    };
    for (std::uint64_t b = 0; b <= 0xffffffffu; b += 4093) check(static_cast<std::uint32_t>(b));
    for (const float edge : {std::ldexp(1.0f, -25), std::ldexp(1.0f, -14), 65504.0f, 65520.0f}) {
        const std::uint32_t e = std::bit_cast<std::uint32_t>(edge);
        for (std::uint32_t d = 0; d < 20000; ++d) {
            check(e + d - 10000);
            check((e + d - 10000) | 0x80000000u);
        }
    }
}
#endif
