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

void WeightedSums(const double* p_hi, const double* p_lo, const double* const* rows, std::size_t n, std::size_t Dv,
                  double* sh, double* sl) {
    const hn::ScalableTag<double> d;
    const std::size_t N = hn::Lanes(d);
    std::size_t col = 0;
    const auto columns = [&](auto dt, std::size_t at) {
        using V = hn::Vec<decltype(dt)>;
        V s = hn::Zero(dt), e_sum = hn::Zero(dt);
        for (std::size_t j = 0; j < n; ++j) {
            const V a = hn::Set(dt, p_hi[j]), pl = hn::Set(dt, p_lo[j]);
            const V v = hn::LoadU(dt, rows[j] + at);
            V a1, a2, v1, v2;
            split(dt, a, a1, a2);
            split(dt, v, v1, v2);
            const V p = hn::Mul(a, v);
            const V e = hn::Sub(hn::Mul(a2, v2),
                                hn::Sub(hn::Sub(hn::Sub(p, hn::Mul(a1, v1)), hn::Mul(a2, v1)), hn::Mul(a1, v2)));
            const V t = hn::Add(s, p);
            const V bb = hn::Sub(t, s);
            const V q = hn::Add(hn::Sub(s, hn::Sub(t, bb)), hn::Sub(p, bb));
            s = t;
            e_sum = hn::Add(e_sum, hn::Add(q, hn::Add(e, hn::Mul(pl, v))));
        }
        // Final TwoSum: hi = RN(s + e_sum).
        const V t = hn::Add(s, e_sum);
        const V bb = hn::Sub(t, s);
        const V lo = hn::Add(hn::Sub(s, hn::Sub(t, bb)), hn::Sub(e_sum, bb));
        hn::StoreU(t, dt, sh + at);
        hn::StoreU(lo, dt, sl + at);
    };
    for (; col + N <= Dv; col += N) columns(d, col);
    for (; col < Dv; ++col) columns(hn::CappedTag<double, 1>(), col);
}

void AccumulateKey(const double* v, const double* od, std::size_t Dv, double flush_below, double p, double pB, double w,
                   double pB_self, double* sc, double* av_sum, double* av_self, double* av_impl, double* spread,
                   double* dv, double* absterm) {
    const hn::ScalableTag<double> d;
    const std::size_t N = hn::Lanes(d);
    std::size_t col = 0;
    const auto columns = [&](auto dt, std::size_t at) {
        using V = hn::Vec<decltype(dt)>;
        const V x = hn::LoadU(dt, v + at);
        const V av = hn::Abs(x);
        const V dd = hn::Abs(hn::Sub(x, hn::LoadU(dt, od + at)));
        const V ev = hn::IfThenElseZero(hn::Lt(av, hn::Set(dt, flush_below)), av);
        const V vp = hn::Set(dt, p), vpB = hn::Set(dt, pB), vw = hn::Set(dt, w), vs = hn::Set(dt, pB_self);
        const auto add = [&](double* a, V y) { hn::StoreU(hn::Add(hn::LoadU(dt, a + at), y), dt, a + at); };
        add(sc, hn::Mul(vp, av));
        add(av_sum, av);
        add(av_self, hn::Mul(vs, av));
        add(av_impl, ev);
        add(spread, hn::Mul(vpB, hn::Add(dd, ev)));
        add(dv, hn::Mul(vw, ev));
        add(absterm, hn::Mul(vw, hn::Add(av, ev)));
    };
    for (; col + N <= Dv; col += N) columns(d, col);
    for (; col < Dv; ++col) columns(hn::CappedTag<double, 1>(), col);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::oracle::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::oracle::detail {

HWY_EXPORT(WeightedSums);
HWY_EXPORT(AccumulateKey);

void weighted_sums_dd_simd(const double* p_hi, const double* p_lo, const double* const* rows, std::size_t n,
                           std::size_t Dv, double* sh, double* sl) {
    HWY_DYNAMIC_DISPATCH(WeightedSums)(p_hi, p_lo, rows, n, Dv, sh, sl);
}

void accumulate_key_simd(const double* v, const double* od, std::size_t Dv, double flush_below, double p, double pB,
                         double w, double pB_self, double* sc, double* av_sum, double* av_self, double* av_impl,
                         double* spread, double* dv, double* absterm) {
    HWY_DYNAMIC_DISPATCH(AccumulateKey)(v, od, Dv, flush_below, p, pB, w, pB_self, sc, av_sum, av_self, av_impl, spread,
                                        dv, absterm);
}

}  // namespace attn::oracle::detail
#endif  // HWY_ONCE
