// The double-double arithmetic of the oracle's default path (oracle/src/dd.hpp) against MPFR at 261 bits: each
// operation within the kDdOp it is charged (measured: a few u^2), the exp within kDdExp, on random operands that
// cover the exponent range the oracle uses them on.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dd.hpp"
#include "simd.hpp"
#include "types.hpp"

namespace dd = attn::oracle::detail;
using Real = dd::Mpfr261;

namespace {

Real value(dd::DoubleDouble x) { return Real(x.hi) + Real(x.lo); }

// A normalised double-double: hi random with exponent in [-e, e], lo below half its ulp.
dd::DoubleDouble random_dd(std::mt19937_64& rng, int e) {
    std::uniform_real_distribution<double> mant(-1.0, 1.0);
    std::uniform_int_distribution<int> exp(-e, e);
    const double hi = std::ldexp(mant(rng), exp(rng));
    const double lo = std::ldexp(mant(rng), std::ilogb(hi == 0 ? 1.0 : hi) - 54);
    dd::DoubleDouble z;
    dd::two_sum(hi, lo, z.hi, z.lo);
    return z;
}

double rel_error(const Real& computed, const Real& exact) {
    return exact == 0 ? static_cast<double>(abs(computed)) : static_cast<double>(abs(computed - exact) / abs(exact));
}

}  // namespace

TEST_CASE("double-double +, *, / are within kDdOp and near their published bounds", "[oracle][dd]") {
    std::mt19937_64 rng(42);
    const double u2 = 0x1p-106;
    double worst_add = 0, worst_mul = 0, worst_div = 0;
    for (int t = 0; t < 200000; ++t) {
        const dd::DoubleDouble x = random_dd(rng, 60), y = random_dd(rng, 60);
        worst_add = std::max(worst_add, rel_error(value(dd::dd_add(x, y)), value(x) + value(y)));
        worst_mul = std::max(worst_mul, rel_error(value(dd::dd_mul(x, y)), value(x) * value(y)));
        if (y.hi != 0) worst_div = std::max(worst_div, rel_error(value(dd::dd_div(x, y)), value(x) / value(y)));
    }
    INFO("worst relative errors in u^2: add " << worst_add / u2 << ", mul " << worst_mul / u2 << ", div "
                                             << worst_div / u2);
    CHECK(worst_add <= 3 * u2);
    CHECK(worst_mul <= 8 * u2);
    CHECK(worst_div <= 12 * u2);
    CHECK(std::max({worst_add, worst_mul, worst_div}) <= dd::kDdOp);
}

TEST_CASE("double-double exp of x <= 0 is within kDdExp, exact at 0, and 0 far below the range", "[oracle][dd]") {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    double worst = 0;
    for (int t = 0; t < 100000; ++t) {
        // |x| from 2^-60 to 700 (log-uniform), and exact multiples of ln 2 near the reduction's boundaries.
        const double mag = std::exp2(unit(rng) * 69.5 - 60);
        dd::DoubleDouble x{-mag, 0.0};
        if (t % 10 == 0) x = {-std::round(unit(rng) * 1000) * 0.34657359027997264, 0.0};
        const Real exact = exp(value(x));
        const Real computed = value(dd::dd_exp_nonpositive(x));
        if (exact < Real(0x1p-968))  // the parts underflow: an absolute error of at most 2^-1073
            CHECK(static_cast<double>(abs(computed - exact)) <= dd::kDdExp * static_cast<double>(exact) + 0x1p-1073);
        else
            worst = std::max(worst, rel_error(computed, exact));
    }
    INFO("worst relative error " << worst << " = 2^" << std::log2(worst));
    CHECK(worst <= dd::kDdExp);
    const dd::DoubleDouble one = dd::dd_exp_nonpositive({0.0, 0.0});
    CHECK(one.hi == 1.0);
    CHECK(one.lo == 0.0);
    CHECK(dd::dd_exp_nonpositive({-1200.0, 0.0}).hi == 0.0);
    // Below 2^-968 the result's parts underflow: absolute error at most 2^-1073.
    for (const double x : {-680.0, -700.0, -720.0, -745.0}) {
        const dd::DoubleDouble e = dd::dd_exp_nonpositive({x, 0.0});
        const Real exact = exp(Real(x));
        CHECK(static_cast<double>(abs(value(e) - exact)) <= dd::kDdExp * static_cast<double>(exact) + 0x1p-1073);
    }
}

TEST_CASE("the SIMD exp and weighted sums give bitwise the scalar results", "[oracle][dd]") {
    std::mt19937_64 rng(9);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const std::size_t n = 1003;  // not a multiple of any vector width: the scalar tail too
    std::vector<double> xh(n), xl(n), eh(n), el(n);
    for (std::size_t c = 0; c < n; ++c) {
        const double mag = c % 7 == 0 ? unit(rng) * 1200 : std::exp2(unit(rng) * 70 - 60);  // beyond -690 and -1100 too
        const dd::DoubleDouble x = dd::dd_add({-mag, 0.0}, {-mag * 0x1p-60 * unit(rng), 0.0});
        xh[c] = x.hi, xl[c] = x.lo;
    }
    xh[5] = 0, xl[5] = 0;
    dd::dd_exp_nonpositive_simd(xh.data(), xl.data(), n, eh.data(), el.data());
    for (std::size_t c = 0; c < n; ++c) {
        const dd::DoubleDouble e = dd::dd_exp_nonpositive({xh[c], xl[c]});
        CAPTURE(c, xh[c]);
        REQUIRE(std::memcmp(&e.hi, &eh[c], sizeof(double)) == 0);
        REQUIRE(std::memcmp(&e.lo, &el[c], sizeof(double)) == 0);
    }
    // The weighted sums: per column, the Dot2 of (p_hi, p_lo) with the column, against the scalar operations.
    const std::size_t keys = 37, Dv = 13;
    std::vector<double> p_hi(keys), p_lo(keys), values(keys * Dv), sh(Dv), sl(Dv);
    std::vector<const double*> rows(keys);
    for (std::size_t c = 0; c < keys; ++c) {
        const dd::DoubleDouble p = dd::dd_div({unit(rng), 0.0}, {7.0, 0.0});
        p_hi[c] = p.hi, p_lo[c] = p.lo;
        for (std::size_t col = 0; col < Dv; ++col) values[c * Dv + col] = unit(rng) * 4 - 2;
        rows[c] = values.data() + c * Dv;
    }
    dd::weighted_sums_dd_simd(p_hi.data(), p_lo.data(), rows.data(), keys, Dv, sh.data(), sl.data());
    for (std::size_t col = 0; col < Dv; ++col) {
        double s = 0, e_sum = 0;
        for (std::size_t c = 0; c < keys; ++c) {
            double p, e, t, q;
            dd::two_prod(p_hi[c], rows[c][col], p, e);
            dd::two_sum(s, p, t, q);
            s = t;
            e_sum += q + (e + p_lo[c] * rows[c][col]);
        }
        double hi, lo;
        dd::two_sum(s, e_sum, hi, lo);
        CHECK(std::memcmp(&hi, &sh[col], sizeof(double)) == 0);
        CHECK(std::memcmp(&lo, &sl[col], sizeof(double)) == 0);
    }
}
