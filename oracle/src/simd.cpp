// The oracle's per-column loops (simd.hpp), once per Highway target: this file includes itself through
// hwy/foreach_target.h, and HWY_DYNAMIC_DISPATCH picks the best target the CPU has on the first call, as the
// library's tiled kernel does (lib/src/sdpa_tiled.cpp). The oracle is compiled with -ffp-contract=off, so no
// multiply and add here is fused: every lane rounds as the scalar code does.
#include "simd.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "simd.cpp"  // found through oracle/src on the include path
#include <hwy/foreach_target.h>         // must come before highway.h
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::oracle::detail {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V>
HWY_INLINE void split(D d, V a, V& hi, V& lo) {
    const V c = hn::Mul(hn::Set(d, 134217729.0), a);  // 2^27 + 1 (Veltkamp)
    hi = hn::Sub(c, hn::Sub(c, a));
    lo = hn::Sub(a, hi);
}

// body(tag, i) over [0, count): whole vectors, then one lane at a time for the tail.
template <class Body>
HWY_INLINE void over_lanes(std::size_t count, Body body) {
    const hn::ScalableTag<double> d;
    const std::size_t N = hn::Lanes(d);
    std::size_t i = 0;
    for (; i + N <= count; i += N) body(d, i);
    for (; i < count; ++i) body(hn::CappedTag<double, 1>(), i);
}

// Double-double operations per lane, exactly dd.hpp's (TwoSum, Fast2Sum, Dekker's TwoProduct).
template <class D, class V>
HWY_INLINE void two_sum_v(D, V a, V b, V& s, V& e) {
    s = hn::Add(a, b);
    const V bb = hn::Sub(s, a);
    e = hn::Add(hn::Sub(a, hn::Sub(s, bb)), hn::Sub(b, bb));
}
template <class D, class V>
HWY_INLINE void fast_two_sum_v(D, V a, V b, V& s, V& e) {
    s = hn::Add(a, b);
    e = hn::Sub(b, hn::Sub(s, a));
}
template <class D, class V>
HWY_INLINE void two_prod_v(D d, V a, V b, V& p, V& e) {
    V a1, a2, b1, b2;
    split(d, a, a1, a2);
    split(d, b, b1, b2);
    p = hn::Mul(a, b);
    e = hn::Sub(hn::Mul(a2, b2), hn::Sub(hn::Sub(hn::Sub(p, hn::Mul(a1, b1)), hn::Mul(a2, b1)), hn::Mul(a1, b2)));
}
template <class D, class V>
HWY_INLINE void dd_add_v(D d, V xh, V xl, V yh, V yl, V& zh, V& zl) {
    V sh, sl, th, tl, vh, vl;
    two_sum_v(d, xh, yh, sh, sl);
    two_sum_v(d, xl, yl, th, tl);
    fast_two_sum_v(d, sh, hn::Add(sl, th), vh, vl);
    fast_two_sum_v(d, vh, hn::Add(tl, vl), zh, zl);
}
template <class D, class V>
HWY_INLINE void dd_mul_v(D d, V xh, V xl, V yh, V yl, V& zh, V& zl) {
    V ch, cl;
    two_prod_v(d, xh, yh, ch, cl);
    const V t = hn::Add(hn::Mul(xl, yh), hn::Mul(xh, yl));
    fast_two_sum_v(d, ch, hn::Add(cl, t), zh, zl);
}

void ExpNonpositive(const double* x_hi, const double* x_lo, std::size_t n, double* e_hi, double* e_lo) {
    const DdExpTables& tb = dd_exp_tables();
    const hn::ScalableTag<double> d;
    const hn::RebindToSigned<decltype(d)> di;
    const std::size_t N = hn::Lanes(d);
    using V = hn::Vec<decltype(d)>;
    std::size_t j = 0;
    for (; j + N <= n; j += N) {
        const V xh = hn::LoadU(d, x_hi + j), xl = hn::LoadU(d, x_lo + j);
        const V k = hn::Round(hn::Mul(xh, hn::Set(d, DdExpTables::kInvM)));  // to nearest even, as nearbyint
        V rh, rl;
        dd_add_v(d, xh, xl, hn::Neg(hn::Mul(k, hn::Set(d, DdExpTables::M1))), hn::Zero(d), rh, rl);
        dd_add_v(d, rh, rl, hn::Neg(hn::Mul(k, hn::Set(d, DdExpTables::M2))), hn::Zero(d), rh, rl);
        dd_add_v(d, rh, rl, hn::Neg(hn::Mul(k, hn::Set(d, DdExpTables::M3))), hn::Zero(d), rh, rl);
        V t = hn::Set(d, tb.c_tail[10]);
        for (int m = 9; m >= 6; --m) t = hn::Add(hn::Mul(t, rh), hn::Set(d, tb.c_tail[m]));
        V yh = t, yl = hn::Zero(d);
        for (int m = 5; m >= 0; --m) {
            V ph, pl;
            dd_mul_v(d, yh, yl, rh, rl, ph, pl);
            dd_add_v(d, ph, pl, hn::Set(d, tb.c[m].hi), hn::Set(d, tb.c[m].lo), yh, yl);
        }
        const V q = hn::Floor(hn::Mul(k, hn::Set(d, 1.0 / 64)));  // exact
        const auto idx = hn::ConvertTo(di, hn::Sub(k, hn::Mul(hn::Set(d, 64.0), q)));
        const V th = hn::GatherIndex(d, tb.two_j_hi, idx), tl = hn::GatherIndex(d, tb.two_j_lo, idx);
        dd_mul_v(d, th, tl, yh, yl, yh, yl);
        // 2^q for q >= -1000 from its exponent bits (exact scaling, as ldexp); other lanes are redone below.
        const auto qi = hn::ConvertTo(di, hn::Max(q, hn::Set(d, -1000.0)));
        const V scale = hn::BitCast(d, hn::ShiftLeft<52>(hn::Add(qi, hn::Set(di, 1023))));
        hn::StoreU(hn::Mul(yh, scale), d, e_hi + j);
        hn::StoreU(hn::Mul(yl, scale), d, e_lo + j);
    }
    // The tail, and every lane whose scaling leaves the normal range or whose result is 0: the scalar function.
    for (std::size_t c = 0; c < n; ++c)
        if (c >= j || x_hi[c] < -690) {
            const DoubleDouble e = dd_exp_nonpositive({x_hi[c], x_lo[c]});
            e_hi[c] = e.hi, e_lo[c] = e.lo;
        }
}

void WeightedSums(const double* p_hi, const double* p_lo, const double* const* rows, std::size_t n, std::size_t Dv,
                  double* sh, double* sl) {
    over_lanes(Dv, [&](auto dt, std::size_t at) {
        using V = hn::Vec<decltype(dt)>;
        V s = hn::Zero(dt), e_sum = hn::Zero(dt);
        for (std::size_t j = 0; j < n; ++j) {
            const V v = hn::LoadU(dt, rows[j] + at);
            V p, e, t, q;
            two_prod_v(dt, hn::Set(dt, p_hi[j]), v, p, e);
            two_sum_v(dt, s, p, t, q);
            s = t;
            e_sum = hn::Add(e_sum, hn::Add(q, hn::Add(e, hn::Mul(hn::Set(dt, p_lo[j]), v))));
        }
        V hi, lo;
        two_sum_v(dt, s, e_sum, hi, lo);  // hi = RN(s + e_sum)
        hn::StoreU(hi, dt, sh + at);
        hn::StoreU(lo, dt, sl + at);
    });
}

void AccumulateRow(const double* const* rows, std::size_t n, const double* od, std::size_t Dv, double flush_below,
                   const double* p, const double* pB, const double* w, const double* pB_self, double* sc,
                   double* av_sum, double* av_self, double* spread_self, double* av_impl, double* spread, double* dv,
                   double* absterm) {
    over_lanes(Dv, [&](auto dt, std::size_t at) {
        using V = hn::Vec<decltype(dt)>;
        const V o = hn::LoadU(dt, od + at), below = hn::Set(dt, flush_below);
        V s_sc = hn::Zero(dt), s_av = hn::Zero(dt), s_self = hn::Zero(dt), s_self_d = hn::Zero(dt),
          s_impl = hn::Zero(dt), s_spread = hn::Zero(dt), s_dv = hn::Zero(dt), s_abs = hn::Zero(dt);
        for (std::size_t j = 0; j < n; ++j) {
            const V x = hn::LoadU(dt, rows[j] + at);
            const V av = hn::Abs(x);
            const V dd = hn::Abs(hn::Sub(x, o));
            const V ev = hn::IfThenElseZero(hn::Lt(av, below), av);
            const V vw = hn::Set(dt, w[j]);
            s_sc = hn::Add(s_sc, hn::Mul(hn::Set(dt, p[j]), av));
            s_av = hn::Add(s_av, av);
            const V vs = hn::Set(dt, pB_self[j]);
            s_self = hn::Add(s_self, hn::Mul(vs, av));
            s_self_d = hn::Add(s_self_d, hn::Mul(vs, dd));
            s_impl = hn::Add(s_impl, ev);
            s_spread = hn::Add(s_spread, hn::Mul(hn::Set(dt, pB[j]), hn::Add(dd, ev)));
            s_dv = hn::Add(s_dv, hn::Mul(vw, ev));
            s_abs = hn::Add(s_abs, hn::Mul(vw, hn::Add(av, ev)));
        }
        hn::StoreU(s_sc, dt, sc + at);
        hn::StoreU(s_av, dt, av_sum + at);
        hn::StoreU(s_self, dt, av_self + at);
        hn::StoreU(s_self_d, dt, spread_self + at);
        hn::StoreU(s_impl, dt, av_impl + at);
        hn::StoreU(s_spread, dt, spread + at);
        hn::StoreU(s_dv, dt, dv + at);
        hn::StoreU(s_abs, dt, absterm + at);
    });
}

void Dot2Keys(const double* q, const double* kT, std::size_t Dk, std::size_t Tk, bool exact_products, double* hi,
              double* lo, double* abs) {
    over_lanes(Tk, [&](auto dt, std::size_t at) {
        using V = hn::Vec<decltype(dt)>;
        V s = hn::Zero(dt), c = hn::Zero(dt), a = hn::Zero(dt);
        for (std::size_t k = 0; k < Dk; ++k) {
            const V x = hn::Set(dt, q[k]);
            const V y = hn::LoadU(dt, kT + k * Tk + at);
            V p = hn::Mul(x, y), e = hn::Zero(dt), t, r;
            if (!exact_products) two_prod_v(dt, x, y, p, e);
            two_sum_v(dt, s, p, t, r);
            s = t;
            c = hn::Add(c, hn::Add(r, e));
            a = hn::Add(a, hn::Abs(p));
        }
        hn::StoreU(s, dt, hi + at);
        hn::StoreU(c, dt, lo + at);
        hn::StoreU(a, dt, abs + at);
    });
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::oracle::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::oracle::detail {

HWY_EXPORT(WeightedSums);
HWY_EXPORT(AccumulateRow);
HWY_EXPORT(Dot2Keys);
HWY_EXPORT(ExpNonpositive);

void dd_exp_nonpositive_simd(const double* x_hi, const double* x_lo, std::size_t n, double* e_hi, double* e_lo) {
    HWY_DYNAMIC_DISPATCH(ExpNonpositive)(x_hi, x_lo, n, e_hi, e_lo);
}

void dot2_keys_simd(const double* q, const double* kT, std::size_t Dk, std::size_t Tk, bool exact_products, double* hi,
                    double* lo, double* abs) {
    HWY_DYNAMIC_DISPATCH(Dot2Keys)(q, kT, Dk, Tk, exact_products, hi, lo, abs);
}

void weighted_sums_dd_simd(const double* p_hi, const double* p_lo, const double* const* rows, std::size_t n,
                           std::size_t Dv, double* sh, double* sl) {
    HWY_DYNAMIC_DISPATCH(WeightedSums)(p_hi, p_lo, rows, n, Dv, sh, sl);
}

void accumulate_row_simd(const double* const* rows, std::size_t n, const double* od, std::size_t Dv, double flush_below,
                         const double* p, const double* pB, const double* w, const double* pB_self, double* sc,
                         double* av_sum, double* av_self, double* spread_self, double* av_impl, double* spread,
                         double* dv, double* absterm) {
    HWY_DYNAMIC_DISPATCH(AccumulateRow)(rows, n, od, Dv, flush_below, p, pB, w, pB_self, sc, av_sum, av_self, spread_self,
                                        av_impl, spread, dv, absterm);
}

}  // namespace attn::oracle::detail
#endif  // HWY_ONCE
