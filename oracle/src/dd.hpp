// Internal: double-double ("double-word") arithmetic for the oracle's default path (oracle/BOUNDS.md section 5):
// error-free transformations, +, *, / and exp with proven relative error bounds, so that the softmax of a row needs
// no multiprecision operation unless its result lies too close to a rounding boundary of the target type.
//
// u = 2^-53. Barring underflow and overflow, each operation's relative error is a small multiple of u^2: 3u^2 for
// the accurate sum of two double-words (Joldes, Muller and Popescu, ACM TOMS 44(2), 2017), a few u^2 for the product
// and quotient below by the same kind of analysis; oracle_test measures each against MPFR on random operands. Every
// operation is charged kDdOp = 2^-100 = 64u^2.
#pragma once

#include <cmath>
#include <limits>

namespace attn::oracle::detail {

struct DoubleDouble {
    double hi = 0, lo = 0;
};

// s + e == a + b exactly (Knuth's TwoSum; no branch, any magnitudes).
inline void two_sum(double a, double b, double& s, double& e) {
    s = a + b;
    const double bb = s - a;
    e = (a - (s - bb)) + (b - bb);
}

// s + e == a + b exactly when |a| >= |b| or a == 0 (Dekker's Fast2Sum).
inline void fast_two_sum(double a, double b, double& s, double& e) {
    s = a + b;
    e = b - (s - a);
}

// hi + lo == a exactly, each of 26 significant bits at most (Veltkamp), for |a| < 2^996.
inline void veltkamp_split(double a, double& hi, double& lo) {
    const double c = 134217729.0 * a;  // 2^27 + 1
    hi = c - (c - a);
    lo = a - hi;
}

// p + e == a * b exactly (Dekker's TwoProduct, no FMA: the portable build has none to inline, and a call to the
// library's fma would serialise the loops it sits in), provided |a|, |b| < 2^996 and the product neither
// overflows nor underflows.
inline void two_prod(double a, double b, double& p, double& e) {
    double a1, a2, b1, b2;
    veltkamp_split(a, a1, a2);
    veltkamp_split(b, b1, b2);
    p = a * b;
    e = a2 * b2 - (((p - a1 * b1) - a2 * b1) - a1 * b2);
}

// The relative error charged per double-double operation (header comment).
inline constexpr double kDdOp = 0x1p-100;

// x + y (AccurateDWPlusDW).
inline DoubleDouble dd_add(DoubleDouble x, DoubleDouble y) {
    double sh, sl, th, tl, vh, vl;
    two_sum(x.hi, y.hi, sh, sl);
    two_sum(x.lo, y.lo, th, tl);
    fast_two_sum(sh, sl + th, vh, vl);
    DoubleDouble z;
    fast_two_sum(vh, tl + vl, z.hi, z.lo);
    return z;
}

inline DoubleDouble dd_neg(DoubleDouble x) { return {-x.hi, -x.lo}; }

// x * y (DWTimesDW: the exact product of the high parts, the cross terms rounded).
inline DoubleDouble dd_mul(DoubleDouble x, DoubleDouble y) {
    double ch, cl;
    two_prod(x.hi, y.hi, ch, cl);
    const double t = x.lo * y.hi + x.hi * y.lo;
    DoubleDouble z;
    fast_two_sum(ch, cl + t, z.hi, z.lo);
    return z;
}

// x / y, y != 0 (DWDivDW: one correction step).
inline DoubleDouble dd_div(DoubleDouble x, DoubleDouble y) {
    const double q1 = x.hi / y.hi;
    const DoubleDouble r = dd_add(x, dd_neg(dd_mul({q1, 0.0}, y)));
    const double q2 = r.hi / y.hi;
    const DoubleDouble r2 = dd_add(r, dd_neg(dd_mul({q2, 0.0}, y)));
    const double q3 = r2.hi / y.hi;
    DoubleDouble z;
    fast_two_sum(q1, q2, z.hi, z.lo);
    return dd_add(z, {q3, 0.0});
}

// x < y, for normalised double-doubles (|lo| <= ulp(hi) / 2).
inline bool dd_less(DoubleDouble x, DoubleDouble y) { return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo); }

// exp(x) for x <= 0 by squaring, with relative error below 2^-90 plus an absolute error of at most 2^-1073 (only
// where the result is below 2^-968, when its parts underflow); it fills the table of dd_exp_nonpositive.
// Derivation (BOUNDS.md section 5):
//   x < -1100: 0 (exp(x) < 2^-1586);
//   k = round(x / ln 2), r = x - k ln 2 with ln 2 = L1 + L2 + L3, L1 and L2 of 42 bits (k L1, k L2 exact for
//       |k| < 2^11), |L1 + L2 + L3 - ln 2| < 2^-143: three additions, |r - (x - k ln 2)| < 3 kDdOp + 2^-132, and
//       |r| < 0.3466 + 2^-40;
//   exp(r / 32) by its Taylor polynomial of degree 12 in Horner form: truncation below 2^-116 relative; 24
//       operations and the coefficients' own rounding (1/n! as dd_div(1, n!), n! exact) within 26 kDdOp
//       (the terms' absolute sum is within e^0.022 of the result);
//   five squarings each double the relative error and add kDdOp: 32 (26 kDdOp + 2^-116) + 31 kDdOp + 3.1 kDdOp
//       (the reduction's) < 867 kDdOp < 2^-90;
//   times 2^k, exact unless a part falls below the normal range (then 2^-1075 per part).
inline DoubleDouble dd_exp_by_squaring(DoubleDouble x) {
    if (x.hi < -1100) return {0.0, 0.0};
    static const DoubleDouble* const coefficients = [] {
        static DoubleDouble c[13];
        double factorial = 1;
        for (int n = 0; n <= 12; ++n) {
            if (n > 0) factorial *= n;  // exact: 12! < 2^53
            c[n] = dd_div({1.0, 0.0}, {factorial, 0.0});
        }
        return c;
    }();
    constexpr double L1 = 0x1.62e42fefa3800p-1, L2 = 0x1.ef35793c76800p-45, L3 = -0x1.9ff0342542fc3p-90;
    const double k = std::nearbyint(x.hi * 0x1.71547652b82fep+0);  // x / ln 2, to nearest
    DoubleDouble r = dd_add(x, {-k * L1, 0.0});
    r = dd_add(r, {-k * L2, 0.0});
    r = dd_add(r, {-k * L3, 0.0});
    const DoubleDouble r32{r.hi / 32, r.lo / 32};  // exact
    DoubleDouble y = coefficients[12];
    for (int n = 11; n >= 0; --n) y = dd_add(dd_mul(y, r32), coefficients[n]);
    for (int i = 0; i < 5; ++i) y = dd_mul(y, y);
    const int e = static_cast<int>(k);
    return {std::ldexp(y.hi, e), std::ldexp(y.lo, e)};
}

// exp(x) for x <= 0 with relative error at most kDdExp plus an absolute error of at most 2^-1073 (only where the
// result is below 2^-968). Table-driven (BOUNDS.md section 5):
//   x < -1100: 0;
//   k = round(64 x / ln 2) = 64 q + j (0 <= j < 64, |k| < 2^17), r = x - k ln2/64 with ln2/64 = M1 + M2 + M3,
//       M1 and M2 of 36 bits (k M1, k M2 exact), |M1 + M2 + M3 - ln2/64| < 2^-142: |r| < 0.00542 and
//       |r - (x - k ln2/64)| < 3 kDdOp + 2^-124;
//   exp(r) by its Taylor polynomial of degree 10: truncation below 2^-108; degrees 10 to 6 in double (they sum to
//       below 2^-54.6, so their own rounding and the use of r's high part cost below 2^-104), degrees 5 to 0 in
//       double-double (12 operations and six coefficients, within 18.2 kDdOp);
//   times 2^(j/64) from a table made by dd_exp_by_squaring (below 2^-90), one product (kDdOp), then 2^q:
//       2^-90 + 22.3 kDdOp + 2^-104 < 2^-89.
inline constexpr double kDdExp = 0x1p-89;

// dd_exp_nonpositive's constants, shared with its SIMD form (simd.hpp): ln2/64 in three parts, 64/ln2, the
// Taylor coefficients and the table of 2^(j/64).
struct DdExpTables {
    static constexpr double M1 = 0x1.62e42fefa0000p-7, M2 = 0x1.cf79abc9e0000p-46, M3 = 0x1.d9cc01f97b57ap-85;
    static constexpr double kInvM = 0x1.71547652b82fep+6;  // 64 / ln 2
    double two_j_hi[64], two_j_lo[64];                      // 2^(j/64)
    DoubleDouble c[6];                                      // 1/n!, n = 0..5
    double c_tail[11] = {};                                 // 1/n!, n = 6..10, in double
};

inline const DdExpTables& dd_exp_tables() {
    static const DdExpTables tables = [] {
        DdExpTables t;
        double factorial = 1;
        for (int n = 0; n <= 10; ++n) {
            if (n > 0) factorial *= n;  // exact
            if (n <= 5) t.c[n] = dd_div({1.0, 0.0}, {factorial, 0.0});
            else t.c_tail[n] = 1.0 / factorial;
        }
        // 2^(j/64) = 2 exp((j - 64) ln2/64), the argument in double-double from M1 + M2 + M3.
        t.two_j_hi[0] = 1.0, t.two_j_lo[0] = 0.0;  // exactly, so that exp(0) = 1 exactly
        for (int j = 1; j < 64; ++j) {
            const double m = j - 64;
            const DoubleDouble arg =
                dd_add(dd_add({m * DdExpTables::M1, 0.0}, {m * DdExpTables::M2, 0.0}), {m * DdExpTables::M3, 0.0});
            const DoubleDouble e = dd_exp_by_squaring(arg);
            t.two_j_hi[j] = 2 * e.hi, t.two_j_lo[j] = 2 * e.lo;
        }
        return t;
    }();
    return tables;
}

inline DoubleDouble dd_exp_nonpositive(DoubleDouble x) {
    if (x.hi < -1100) return {0.0, 0.0};
    const DdExpTables& tables = dd_exp_tables();
    const double k = std::nearbyint(x.hi * DdExpTables::kInvM);  // 64 x / ln 2, to nearest
    DoubleDouble r = dd_add(x, {-k * DdExpTables::M1, 0.0});
    r = dd_add(r, {-k * DdExpTables::M2, 0.0});
    r = dd_add(r, {-k * DdExpTables::M3, 0.0});
    double t = tables.c_tail[10];
    for (int n = 9; n >= 6; --n) t = t * r.hi + tables.c_tail[n];
    DoubleDouble y{t, 0.0};
    for (int n = 5; n >= 0; --n) y = dd_add(dd_mul(y, r), tables.c[n]);
    const double q = std::floor(k * (1.0 / 64));  // exact
    const int j = static_cast<int>(k - 64 * q);
    y = dd_mul({tables.two_j_hi[j], tables.two_j_lo[j]}, y);
    const int e = static_cast<int>(q);
    return {std::ldexp(y.hi, e), std::ldexp(y.lo, e)};
}

}  // namespace attn::oracle::detail
