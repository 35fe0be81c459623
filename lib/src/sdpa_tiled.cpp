// Backend `tiled`: FlashAttention-style online softmax over key blocks; never holds a Tq x Tk matrix.
//
// Shapes per batch element b: q (Tq, Dk), k (Tk, Dk), v (Tk, Dv), output (Tq, Dv). Work items are
// (b, block of Bq query rows). Everything runs transposed so that one SIMD lane is one query:
//   s^T (keys, queries) = scale * k (keys, Dk) @ q^T (Dk, queries)        BLIS micro-kernel, k as the A operand
//   acc^T (Dv, queries) = c * acc^T + v^T (Dv, keys) @ p^T (keys, queries) BLIS micro-kernel, p^T as the B operand
// The micro-kernel writes s^T tiles (mr keys x nr queries, row-stored) exactly where the second product reads
// p^T as its packed B panel, so the scores are never repacked; the softmax pass walks keys with nr queries in
// the lanes (row max, exp and sum are element-wise, no horizontal reductions). k and v are packed once per
// batch element and thread (readable keys only), q once per item.
// Memory per thread: packed k and v (n readable keys x D), packed q and acc (Bq x D), scores (Bq x Bk).
// The rounding structure is documented in attn/tiled.hpp (TiledKernelInfo).
//
// Runtime dispatch: this file includes itself once per Highway target (hwy/foreach_target.h), so the whole kernel,
// packing loops included, is compiled for SSSE3, SSE4, AVX2, AVX3 (AVX-512) and AVX3_DL, plus a scalar fallback;
// HWY_DYNAMIC_DISPATCH picks the best one this CPU supports on the first call (attn/machine.hpp can force a
// lower one). No -march flag is needed. Within one target the bits do not depend on the thread count; across
// targets they may differ (an FMA where an older target multiplies then adds, Exp's polynomial), which the error
// model covers: every target's Exp is measured within tiled_exp_max_ulps (lib/tests/tiled_test.cpp).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <hwy/cache_control.h>

#include "attn/tiled.hpp"
#include "backends.hpp"
#include "gemm.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "sdpa_tiled.cpp"  // found through lib/src on the include path
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace attn::detail {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

namespace {

// Sizes of one call, derived from the micro-tile.
struct Layout {
    Index mr, nr;
    Index Bq, Bk, Bk_pad;        // Bk_pad: the key block rounded up to whole mr panels
    Index q_panels;              // nr-query panels per item
    Index ps_q, ps_k, ps_v;      // panel strides (elements) of packed q, k (per key panel), v (per Dv panel)
    Index k_block_stride;        // elements per packed key block
    Index Dv_pad, dv_panels;
    Index item_blocks;           // the most key blocks one item reads (blocks_per_item)
    Index n;                     // readable keys of the current batch element
    Index slots;                 // packed key blocks kept at once (start_keys): block kb in slot kb % slots
};

// One thread's buffers, reused across its items (the packed keys while b does not change).
template <class T>
struct Workspace {
    std::uint64_t call = 0;  // the call that last used it (thread_workspace)
    Index b = -1;
    std::vector<Index> keys;  // readable key positions of batch element b, ascending
    std::vector<Index> slot_block;   // per slot: the key block of b packed there (pack_block), -1 for none
    PackedBuffer<T> kp, vp, qp, sp, acc, blk;  // blk: one key block's P V for one query panel, before it joins acc
    PackedBuffer<T> bias;                      // one tile's explicit bias, in the layout of s (bias_tile)
    std::vector<T> row_max, row_sum;  // per lane (query)
    // Rows of q, k or v in the compute type while they are packed (row_values: one per lane, `width` apart), a row
    // of zeros for the lanes past the last row, and the lanes' row pointers (transpose_rows).
    std::vector<T> rows, zeros;
    Index width = 0;
    std::vector<const T*> lanes;
    std::vector<char> over;  // per lane of a query panel: an output of its row overflowed (divide_lanes)
    std::vector<T> cut_lo, cut_hi;  // per lane of a query panel: its readable keys in the current tile (cut_positions)
    std::vector<Index> row_begin, row_end;  // per lane: readable keys [row_begin, row_end) pass the positional rule
    // Per query panel: the union [panel_begin, panel_end) and the intersection [all_from, all_see) of its rows' ranges.
    std::vector<Index> panel_begin, panel_end, panel_all_from, panel_all_see;
};

// 16-bit storage -> float32, exactly, one vector at a time: bfloat16 is the top half of a float; a float16's
// exponent-and-significand field shifted into float's place and multiplied by 2^112 (re-biasing 15 -> 127; exact,
// subnormals included), except inf/NaN (field >= 0x7c00), which get float's all-ones exponent, payload kept. The
// bits are those of the scalar conversion (attn/half.hpp) on every target (lib/tests/tiled_test.cpp checks all 2^16
// patterns); Highway 1.0.3's own float16 PromoteTo is not used: without F16C it turns inf/NaN into finite values.
template <class D>
hn::VFromD<D> widen_bits(D df, hn::VFromD<hn::RebindToUnsigned<D>> h, bfloat16*) {
    return hn::BitCast(df, hn::ShiftLeft<16>(h));
}
template <class D>
hn::VFromD<D> widen_bits(D df, hn::VFromD<hn::RebindToUnsigned<D>> h, float16*) {
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    const auto field = hn::And(h, hn::Set(du, 0x7fffu));
    const auto shifted = hn::ShiftLeft<13>(field);
    const auto finite = hn::Mul(hn::BitCast(df, shifted), hn::Set(df, 0x1p112f));
    const auto special = hn::BitCast(df, hn::Or(shifted, hn::Set(du, 0x7f80'0000u)));
    const auto is_special = hn::RebindMask(df, hn::Gt(hn::BitCast(di, field), hn::Set(di, 0x7bff)));
    return hn::Or(hn::IfThenElse(is_special, special, finite), hn::BitCast(df, sign));
}

// dst[i] = float(src[i]) for i < n, SIMD (the packing loops' conversion from 16-bit storage).
template <class S>
void widen(const S* src, Index n, float* dst) {
    const hn::ScalableTag<float> df;
    const hn::RebindToUnsigned<decltype(df)> du32;
    const hn::Rebind<std::uint16_t, decltype(df)> du16;
    const Index N = static_cast<Index>(hn::Lanes(df));
    const auto* bits = reinterpret_cast<const std::uint16_t*>(src);  // both types are one uint16_t (attn/half.hpp)
    Index i = 0;
    for (; i + N <= n; i += N)
        hn::StoreU(widen_bits(df, hn::PromoteTo(du32, hn::LoadU(du16, bits + i)), static_cast<S*>(nullptr)), df,
                   dst + i);
    for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// float32 -> 16-bit storage, rounded to nearest, ties to even, one vector at a time in 32-bit lanes (the output's
// rounding): the bits of the scalar conversion (attn/half.hpp) on every target (lib/tests/tiled_test.cpp checks
// floats 2^9 + 7 bit patterns apart over every exponent, and every float near each format's edges). Highway 1.0.3's
// DemoteTo truncates to bfloat16, and to float16 without F16C. NaN: quiet, the top bits of its payload kept.
// bfloat16: adding 2^15 - 1 plus the kept part's lowest bit rounds the dropped half to nearest even (a carry runs
// into the exponent, up to infinity). float16: magnitudes from 2^16 up are infinity; below 2^-14 (float16's
// subnormals) adding 0.5f rounds to float16's subnormal grid, 2^-24, in float's own addition (0.5f's ulp is 2^-24),
// leaving the result in its low bits; otherwise the bfloat16 rule with 13 bits dropped, exponent re-biased.
template <class D>
hn::VFromD<hn::RebindToUnsigned<D>> narrow_bits(D, hn::VFromD<D> v, bfloat16*) {
    const hn::RebindToUnsigned<D> du;
    const auto u = hn::BitCast(du, v);
    const auto rounded = hn::ShiftRight<16>(
        hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
    const auto nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x0040u));
    return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, rounded);
}
template <class D>
hn::VFromD<hn::RebindToUnsigned<D>> narrow_bits(D df, hn::VFromD<D> v, float16*) {
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const auto u = hn::BitCast(du, v);
    const auto sign = hn::ShiftRight<16>(hn::And(u, hn::Set(du, 0x8000'0000u)));
    const auto a = hn::And(u, hn::Set(du, 0x7fff'ffffu));
    const auto normal = hn::ShiftRight<13>(hn::Add(hn::Sub(a, hn::Set(du, 0x3800'0000u - 0xfffu)),
                                                   hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u))));
    const auto half = hn::Set(df, 0.5f);
    const auto subnormal = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), half)), hn::BitCast(du, half));
    const auto nan = hn::Or(hn::ShiftRight<13>(hn::And(a, hn::Set(du, 0x007f'ffffu))), hn::Set(du, 0x7e00u));
    const auto ai = hn::BitCast(di, a);  // below 2^31: compared as signed
    auto h = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x3880'0000))), subnormal, normal);
    h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x4780'0000 - 1))), hn::Set(du, 0x7c00u), h);
    h = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7f80'0000))), nan, h);
    return hn::Or(h, sign);
}

// dst[i] = S(src[i]) for i < n, SIMD (the output's conversion to 16-bit storage).
template <class S>
void narrow(const float* src, Index n, S* dst) {
    const hn::ScalableTag<float> df;
    const hn::RebindToSigned<decltype(df)> di32;
    const hn::Rebind<std::uint16_t, decltype(df)> du16;
    const Index N = static_cast<Index>(hn::Lanes(df));
    auto* bits = reinterpret_cast<std::uint16_t*>(dst);  // both types are one uint16_t (attn/half.hpp)
    Index i = 0;
    for (; i + N <= n; i += N) {
        const auto h = narrow_bits(df, hn::LoadU(df, src + i), static_cast<S*>(nullptr));  // < 2^16 in each lane
        hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di32, h)), du16, bits + i);
    }
    for (; i < n; ++i) dst[i] = static_cast<S>(src[i]);
}

// The n values row[0], row[stride], ... in the compute type T: the row itself when it is already contiguous T,
// else converted into tmp (SIMD from contiguous 16-bit storage). Exact in every case.
template <class S, class T>
const T* row_values(const S* row, Index stride, Index n, T* tmp) {
    if constexpr (std::is_same_v<S, T>) {
        if (stride == 1) return row;
    } else {
        if (stride == 1) {
            widen(row, n, tmp);
            return tmp;
        }
    }
    for (Index d = 0; d < n; ++d) tmp[d] = static_cast<T>(row[d * stride]);
    return tmp;
}

// One row of n values into panels of w: panel id (at dst + id * stride) gets values [id w, id w + w), zero past
// n. Where a vector of at most 8 lanes holds a panel, a whole panel is one load and one store of that vector, as long
// as the load stays within the row: the store also writes the lanes past w, the start of the next row's place in
// the panel (rows go in ascending order, so the next row writes its own values over them later; the caller leaves
// room after the last row). Masked stores, which would not, measured slow (AMD Zen 5). The rest element by element.
// Data movement only: the same bits either way.
inline constexpr Index panel_spill = 8;  // values a row may write past its panel's w (row_to_panels)
template <class T>
void row_to_panels(const T* row, Index n, Index panels, Index stride, Index w, T* dst) {
    Index id = 0;
#if HWY_TARGET != HWY_SCALAR
    const hn::CappedTag<T, panel_spill> d;
    const Index N = static_cast<Index>(hn::Lanes(d));
    if (w <= N)
        for (; id < panels && id * w + N <= n; ++id) hn::StoreU(hn::LoadU(d, row + id * w), d, dst + id * stride);
#endif
    for (; id < panels; ++id)
        for (Index r = 0; r < w; ++r) dst[id * stride + r] = id * w + r < n ? row[id * w + r] : T(0);
}

// dst[c * n + rr] = lane[rr][c] for c < count and rr < n: n rows side by side become the n lanes of count
// columns (a panel of packed q or k, a tile of bias). For float, 4 x 4 blocks in 128-bit vectors, eight lanes at a
// time over every column: rows a multiple of 4 KiB apart put every lane's current cache line into one L1 set; eight
// of them stay there until their last four columns are read, sixteen would evict each other between two steps. When
// n is not a multiple of 4 the last group of four lanes overlaps the one before it (the same values written twice).
// Data movement only: the same bits either way.
template <class T>
void transpose_rows(const T* const* lane, Index n, Index count, T* dst) {
    Index c0 = 0;
#if HWY_TARGET != HWY_SCALAR
    if constexpr (std::is_same_v<T, float>)
        if (n >= 4) {
            const hn::Full128<float> d4;
            const hn::Repartition<double, decltype(d4)> d2;
            const Index whole = count / 4 * 4;
            for (Index r8 = 0; r8 < n; r8 += 8) {
                for (Index c = 0; c < whole; c += 4) {
                    for (Index g = r8; g < std::min(r8 + 8, n); g += 4) {
                        const Index rr = std::min(g, n - 4);
                        const auto r0 = hn::LoadU(d4, lane[rr] + c), r1 = hn::LoadU(d4, lane[rr + 1] + c);
                        const auto r2 = hn::LoadU(d4, lane[rr + 2] + c), r3 = hn::LoadU(d4, lane[rr + 3] + c);
                        // (r0[0] r1[0] r0[1] r1[1]), (r2[0] r3[0] r2[1] r3[1]), and the same of lanes 2 and 3
                        const auto a = hn::BitCast(d2, hn::InterleaveLower(d4, r0, r1));
                        const auto b = hn::BitCast(d2, hn::InterleaveLower(d4, r2, r3));
                        const auto e = hn::BitCast(d2, hn::InterleaveUpper(d4, r0, r1));
                        const auto f = hn::BitCast(d2, hn::InterleaveUpper(d4, r2, r3));
                        hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d2, a, b)), d4, dst + c * n + rr);
                        hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d2, a, b)), d4, dst + (c + 1) * n + rr);
                        hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d2, e, f)), d4, dst + (c + 2) * n + rr);
                        hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d2, e, f)), d4, dst + (c + 3) * n + rr);
                    }
                }
            }
            c0 = whole;  // the columns left over go one by one below
        }
#endif
    for (Index c = c0; c < count; ++c)
        for (Index rr = 0; rr < n; ++rr) dst[c * n + rr] = lane[rr][c];
}

template <class T>
bool all_finite(const T* s, Index count) {
    const hn::ScalableTag<T> d;
    const Index N = static_cast<Index>(hn::Lanes(d));
    auto ok = hn::IsFinite(hn::Zero(d));
    Index j = 0;
    for (; j + N <= count; j += N) ok = hn::And(ok, hn::IsFinite(hn::LoadU(d, s + j)));
    if (!hn::AllTrue(d, ok)) return false;
    for (; j < count; ++j)
        if (!std::isfinite(s[j])) return false;
    return true;
}

// A row of q, k or v that the kernel packs, with its values unchecked (Readability::values_deferred): the call goes
// back to the contract checks if one is not finite. Looked at as it is packed, so memory is read once.
template <class T>
void watch_row(const T* x, Index count) {
    if (!all_finite(x, count)) throw ValuesNeedChecking{};
}

// Points lane rr (< n) at row `row(rr)` of q or k, in the compute type (row_values, into the workspace's row rr),
// or at zeros where row(rr) is null; with `watch`, watches the rows that `watched(rr)` says a query reads.
template <class S, class T, class Row, class Watched>
const T* const* lane_rows(Workspace<T>& w, Index n, Index stride, Index count, Row row, bool watch, Watched watched) {
    for (Index rr = 0; rr < n; ++rr) {
        const S* x = row(rr);
        w.lanes[rr] = x ? row_values(x, stride, count, w.rows.data() + rr * w.width) : w.zeros.data();
        if (watch && x && watched(rr)) watch_row(w.lanes[rr], count);
    }
    return w.lanes.data();
}

// k -> key blocks of Bk keys, each as mr-key panels: panel element (key r, dim p) at p * mr + r (zero padded);
// v -> per key block, mr-dim panels over its keys: element (key c of the block, dim r) at c * mr + r. Unreadable rows
// never enter. Storage S converts to the compute type T here (exactly, row_values), once per batch element and thread,
// a key block at a time when an item first reads it (pack_block): then the item reads the block's panels from cache,
// not from memory after the packing of every other block (a windowed call's items read two or three blocks each).
// Blocks live in slots, block kb in slot kb % slots, as many slots as one item reads blocks (Layout::item_blocks):
// a window's packed keys stay a few blocks that the cache keeps, where one place per block (8 MB of k and v at
// Tk = 16384, D = 64) would make every packing write fetch lines from memory first.
template <class S, class T>
void start_keys(const SdpaProblem<S>& p, const Readability& r, Index b, Layout& L, Workspace<T>& w) {
    w.b = b;
    w.keys.clear();
    for (Index j = 0; j < p.Tk; ++j)
        if (r.key_readable[static_cast<std::size_t>(j)]) w.keys.push_back(j);
    const Index n = static_cast<Index>(w.keys.size());
    L.n = n;
    const Index key_blocks = (n + L.Bk - 1) / L.Bk;
    L.slots = std::clamp<Index>(L.item_blocks, 1, std::max<Index>(key_blocks, 1));
    w.kp.get(L.slots * L.k_block_stride);
    L.ps_v = round_up(L.Bk_pad * L.mr + panel_spill, 16);  // room for row_to_panels' last row
    w.vp.get(L.slots * L.dv_panels * L.ps_v);
    w.slot_block.assign(static_cast<std::size_t>(L.slots), -1);
}

// Key block kb's slot (start_keys) and whether kb is packed there.
inline Index slot_of(const Layout& L, Index kb) { return kb % L.slots; }
template <class T>
bool is_packed(const Layout& L, const Workspace<T>& w, Index kb) {
    return w.slot_block[static_cast<std::size_t>(slot_of(L, kb))] == kb;
}
template <class T>
T* packed_k(const Layout& L, const Workspace<T>& w, Index kb) {
    return w.kp.data.get() + slot_of(L, kb) * L.k_block_stride;
}
template <class T>
T* packed_v(const Layout& L, const Workspace<T>& w, Index kb) {
    return w.vp.data.get() + slot_of(L, kb) * L.dv_panels * L.ps_v;
}

// Key block kb of batch element w.b (start_keys): its k panels and its keys' v rows.
template <class S, class T>
void pack_block(const SdpaProblem<S>& p, const Readability& r, Index kb, const Layout& L, Workspace<T>& w) {
    const Index b = w.b, c0 = kb * L.Bk, nb = std::min(L.Bk, L.n - c0);
    const Index ks = p.k.stride(-1), vs = p.v.stride(-1);
    T* block = packed_k(L, w, kb);
    T* vblock = packed_v(L, w, kb);
    for (Index ip = 0; ip < L.Bk_pad / L.mr; ++ip) {
        const auto lane = lane_rows<S>(
            w, L.mr, ks, p.Dk,
            [&](Index rr) { return ip * L.mr + rr < nb ? p.k_row(b, w.keys[c0 + ip * L.mr + rr]) : nullptr; },
            r.values_deferred, [](Index) { return true; });
        transpose_rows(lane, L.mr, p.Dk, block + ip * L.ps_k);
    }
    for (Index c = c0; c < c0 + nb; ++c) {
        const T* vrow = row_values(p.v_row(b, w.keys[c]), vs, p.Dv, w.rows.data());
        if (r.values_deferred) watch_row(vrow, p.Dv);
        row_to_panels(vrow, p.Dv, L.dv_panels, L.ps_v, L.mr, vblock + (c - c0) * L.mr);
    }
    w.slot_block[static_cast<std::size_t>(slot_of(L, kb))] = kb;
}

// The kernel's exp (forward and backward; its arguments are s - max, m_old - m_new and s - lse, <= 0 up to the
// rounding of a saved lse, or -inf): Highway's Exp (hwy/contrib/math/math-inl.h) with its reduction and polynomial,
// x = q ln2 + r, q = round(x / ln2), r in two Cody-Waite steps (|r| <= ln2 / 2), exp(r) = 1 + (r + r^2 P(r))
// (Highway's ExpPoly), times 2^q, but fewer operations on the way to q and 2^q:
// - q from adding 1.5 * 2^(digits - 1), whose ulp is 1: the sum holds q in its low significand bits, and q as a
//   float is the sum minus that constant, exactly. Highway rounds through int32 (two conversions; for double a
//   narrowing and a widening across lanes).
// - With AVX-512, 2^q by scalef, one rounding, as Highway's two multiplications by 2^floor(q/2) and 2^(q -
//   floor(q/2)) (the first exact), which the other targets keep, with the exponents from q's bits.
// - x below `lowest` is raised to it, whose exp rounds to 0: -inf gives 0 without Highway's compare and select.
// The same results as Highway's Exp except where the two roundings of x / ln2 pick neighbouring q; within
// tiled_exp_max_ulps on every target, subnormal results included (lib/tests/tiled_test.cpp measures it).
template <class T>
struct ExpConstants;
template <>
struct ExpConstants<float> {
    using Bits = std::int32_t;
    static constexpr float lowest = -104.0f;        // exp(-104) = 6.8e-46 < 2^-150: rounds to 0
    static constexpr float round = 12582912.0f;     // 1.5 * 2^23
    static constexpr Bits round_bits = 0x4b400000;  // its bits
    static constexpr int exponent_bias = 127, significand_bits = 23;
    static constexpr float ln2_hi = 0.693145751953125f;  // 16 significant bits: q ln2_hi exact for |q| < 2^8
    static constexpr float ln2_lo = 1.428606765330187045e-6f;
};
template <>
struct ExpConstants<double> {
    using Bits = std::int64_t;
    static constexpr double lowest = -746.0;                // exp(-746) = 1.0e-324 < 2^-1075: rounds to 0
    static constexpr double round = 6755399441055744.0;     // 1.5 * 2^52
    static constexpr Bits round_bits = 0x4338000000000000;  // its bits
    static constexpr int exponent_bias = 1023, significand_bits = 52;
    static constexpr double ln2_hi = 0.6931471805596629565116018;  // q ln2_hi exact for |q| < 2^11
    static constexpr double ln2_lo = 0.28235290563031577122588448175e-12;
};

#if HWY_TARGET <= HWY_AVX3
// y 2^q for integral q, rounded once: AVX-512's scalef (Highway 1.0.3 has no op for it).
template <size_t N>
HWY_INLINE hn::Vec128<float, N> times_power_of_two(hn::Vec128<float, N> y, hn::Vec128<float, N> q) {
    return hn::Vec128<float, N>{_mm_scalef_ps(y.raw, q.raw)};
}
template <size_t N>
HWY_INLINE hn::Vec128<double, N> times_power_of_two(hn::Vec128<double, N> y, hn::Vec128<double, N> q) {
    return hn::Vec128<double, N>{_mm_scalef_pd(y.raw, q.raw)};
}
HWY_INLINE hn::Vec512<float> times_power_of_two(hn::Vec512<float> y, hn::Vec512<float> q) {
    return hn::Vec512<float>{_mm512_scalef_ps(y.raw, q.raw)};
}
HWY_INLINE hn::Vec512<double> times_power_of_two(hn::Vec512<double> y, hn::Vec512<double> q) {
    return hn::Vec512<double>{_mm512_scalef_pd(y.raw, q.raw)};
}
#endif

template <class D, class V = hn::VFromD<D>>
HWY_INLINE V kernel_exp(D d, V x) {
    using T = hn::TFromD<D>;
    using C = ExpConstants<T>;
    x = hn::Max(x, hn::Set(d, C::lowest));
    const V t = hn::MulAdd(x, hn::Set(d, T(1.442695040888963407359924681)), hn::Set(d, C::round));
    const V q = hn::Sub(t, hn::Set(d, C::round));  // round(x / ln2), exactly
    V r = hn::NegMulAdd(q, hn::Set(d, C::ln2_hi), x);
    r = hn::NegMulAdd(q, hn::Set(d, C::ln2_lo), r);
    const V y = hn::Add(hn::impl::ExpImpl<T>().ExpPoly(d, r), hn::Set(d, T(1)));
#if HWY_TARGET <= HWY_AVX3
    return times_power_of_two(y, q);
#else
    const hn::RebindToSigned<D> di;
    const auto qi = hn::Sub(hn::BitCast(di, t), hn::Set(di, C::round_bits));
    const auto half = hn::ShiftRight<1>(qi);  // floor(q / 2)
    const auto bias = hn::Set(di, typename C::Bits(C::exponent_bias));
    const V first = hn::BitCast(d, hn::ShiftLeft<C::significand_bits>(hn::Add(half, bias)));
    const V second = hn::BitCast(d, hn::ShiftLeft<C::significand_bits>(hn::Add(hn::Sub(qi, half), bias)));
    return hn::Mul(hn::Mul(y, first), second);
#endif
}

// kernel_exp that passes NaN through (a NaN logit reaches here only with check_finite off).
template <class D, class V>
HWY_INLINE V exp_or_nan(D d, V x) {
    const auto nan = hn::IsNaN(x);
    return hn::IfThenElse(nan, x, kernel_exp(d, hn::IfThenZeroElse(nan, x)));
}

// Online softmax over one key block for the nr queries of one panel (lanes), keys [0, nb) of s (Bk_pad, nr):
// m_new = max(m, max_c s_c); p_c = Exp(s_c - m_new) in place; c = Exp(m - m_new); l = c l + sum_c p_c (the sum
// sequential over keys); acc (Dv_pad, nr) *= c. Rows with nothing allowed yet keep m = -inf and get p = 0.
// Without NaNs (check_finite on: every logit is finite or -inf), Exp directly: the same values, three operations
// fewer per vector.
template <bool NaNs, class D, class T = hn::TFromD<D>>
void online_softmax(D d, T* s, Index nb, Index nr, T* m, T* l, T* acc, Index Dv_pad) {
    const auto exp = [d](auto x) { return NaNs ? exp_or_nan(d, x) : kernel_exp(d, x); };
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
    for (Index x = 0; x < nr; x += N) {
        const auto m_old = hn::LoadU(d, m + x);
        // The max in four chains (exact in any order), so that the loop does not wait on each Max's latency.
        auto m0 = m_old, m1 = m_old, m2 = m_old, m3 = m_old;
        Index c = 0;
        for (; c + 4 <= nb; c += 4) {
            m0 = hn::Max(m0, hn::LoadU(d, s + c * nr + x)), m1 = hn::Max(m1, hn::LoadU(d, s + (c + 1) * nr + x));
            m2 = hn::Max(m2, hn::LoadU(d, s + (c + 2) * nr + x)), m3 = hn::Max(m3, hn::LoadU(d, s + (c + 3) * nr + x));
        }
        for (; c < nb; ++c) m0 = hn::Max(m0, hn::LoadU(d, s + c * nr + x));
        const auto m_new = hn::Max(hn::Max(m0, m1), hn::Max(m2, m3));
        // Subtract 0 where the max is still -inf: exp(-inf - 0) = 0, never exp(-inf - -inf) = NaN.
        const auto m_sub = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
        auto sum = hn::Zero(d);
        for (Index c = 0; c < nb; ++c) {
            const auto pc = exp(hn::Sub(hn::LoadU(d, s + c * nr + x), m_sub));
            hn::StoreU(pc, d, s + c * nr + x);
            sum = hn::Add(sum, pc);
        }
        const auto rescale = exp(hn::Sub(m_old, m_sub));  // 1 when the max did not move, 0 from -inf
        hn::StoreU(m_new, d, m + x);
        hn::StoreU(hn::MulAdd(hn::LoadU(d, l + x), rescale, sum), d, l + x);
        for (Index dv = 0; dv < Dv_pad; ++dv)
            hn::StoreU(hn::Mul(hn::LoadU(d, acc + dv * nr + x), rescale), d, acc + dv * nr + x);
    }
}

// f(d) with the widest vector tag d whose lanes split a query panel of nr rows, else one lane. The steps that take a
// panel in vectors (the online softmax, the positional cut, the bias, the division) are element-wise per lane, so
// the width changes nothing in their results.
template <class T, class F>
decltype(auto) with_lane_width(Index nr, F&& f) {
    const hn::ScalableTag<T> d;
    return nr % static_cast<Index>(hn::Lanes(d)) == 0 ? f(d) : f(hn::CappedTag<T, 1>());
}

template <class T>
void online_softmax_any_width(T* s, Index nb, Index nr, T* m, T* l, T* acc, Index Dv_pad, bool nans) {
    with_lane_width<T>(nr, [&](auto d) {
        nans ? online_softmax<true>(d, s, nb, nr, m, l, acc, Dv_pad) : online_softmax<false>(d, s, nb, nr, m, l, acc, Dv_pad);
    });
}

// Step 3's positional cut in vectors: s[c * nr + x] = -inf where key c is outside lane x's [lo[x], hi[x]), looking
// only at keys c < c_lo (the largest lo) and c >= c_hi (the smallest hi). Key offsets in T: exact below 2^digits
// (the caller's test).
template <class D, class T = hn::TFromD<D>>
void cut_positions(D d, T* s, Index nb, Index nr, const T* lo, const T* hi, Index c_lo, Index c_hi) {
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
    for (Index x = 0; x < nr; x += N) {
        const auto l = hn::LoadU(d, lo + x), h = hn::LoadU(d, hi + x);
        for (Index c = 0; c < c_lo; ++c)
            hn::StoreU(hn::IfThenElse(hn::Lt(hn::Set(d, T(c)), l), neg_inf, hn::LoadU(d, s + c * nr + x)), d, s + c * nr + x);
        for (Index c = c_hi; c < nb; ++c)
            hn::StoreU(hn::IfThenElse(hn::Ge(hn::Set(d, T(c)), h), neg_inf, hn::LoadU(d, s + c * nr + x)), d, s + c * nr + x);
    }
}

template <class T>
void cut_positions_any_width(T* s, Index nb, Index nr, const T* lo, const T* hi, Index c_lo, Index c_hi) {
    with_lane_width<T>(nr, [&](auto d) { cut_positions(d, s, nb, nr, lo, hi, c_lo, c_hi); });
}

// Step 6's division in the lanes of one query panel: a[dv * nr + x] /= l[x] for dv < Dv (the same division per
// element as one row at a time); over[x] = whether a quotient of lane x is not finite (|q| <= max is false for NaN
// and both infinities).
template <class D, class T = hn::TFromD<D>>
void divide_lanes(D d, T* a, const T* l, Index Dv, Index nr, char* over) {
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto max = hn::Set(d, std::numeric_limits<T>::max());
    HWY_ALIGN T flags[hn::MaxLanes(d)];
    for (Index x = 0; x < nr; x += N) {
        const auto lv = hn::LoadU(d, l + x);
        auto bad = hn::FirstN(d, 0);
        for (Index dv = 0; dv < Dv; ++dv) {
            const auto q = hn::Div(hn::LoadU(d, a + dv * nr + x), lv);
            hn::StoreU(q, d, a + dv * nr + x);
            bad = hn::Or(bad, hn::Not(hn::Le(hn::Abs(q), max)));
        }
        hn::Store(hn::IfThenElseZero(bad, hn::Set(d, T(1))), d, flags);
        for (Index i = 0; i < N; ++i) over[x + i] = flags[i] != T(0);
    }
}

template <class T>
void divide_lanes_any_width(T* a, const T* l, Index Dv, Index nr, char* over) {
    with_lane_width<T>(nr, [&](auto d) { divide_lanes(d, a, l, Dv, nr, over); });
}

// tanh of float lanes y with |y| <= tanh_float_limit: y P(y^2) / Q(y^2), a rational approximation of tanh y / y
// in y^2 fitted to relative error 2.1e-8 on [0, 9.02] (tools/workshop/fit_tanh.py: least squares reweighted toward the
// minimax), Horner in float (fused where the target has FMA). About four times as fast as Highway's Tanh (an
// Expm1 and a division) and within tiled_tanh_max_ulps: every float argument in [2^-13, 16] is checked on every
// target (lib/tests/tiled_test.cpp); below 2^-13 P and Q round to 1, so the result is y, within 1 ulp of tanh y.
// It is odd in y bit for bit (round to nearest is symmetric); from the limit on, tanh rounds to +-1 in float.
constexpr float tanh_float_limit = 9.02f;
template <class D>
hn::VFromD<D> tanh_float(D d, hn::VFromD<D> y) {
    const auto z = hn::Mul(y, y);
    auto p = hn::Set(d, 1.3325627961782714e-08f);
    p = hn::MulAdd(p, z, hn::Set(d, 2.0588528973849803e-05f));
    p = hn::MulAdd(p, z, hn::Set(d, 3.494355933489296e-03f));
    p = hn::MulAdd(p, z, hn::Set(d, 1.3379993780110441e-01f));
    p = hn::MulAdd(p, z, hn::Set(d, 9.9999998015956015e-01f));
    auto q = hn::Set(d, 7.7647947151708224e-07f);
    q = hn::MulAdd(q, z, hn::Set(d, 3.2836079215419503e-04f));
    q = hn::MulAdd(q, z, hn::Set(d, 2.5872311817325022e-02f));
    q = hn::MulAdd(q, z, hn::Set(d, 4.6713309387766644e-01f));
    q = hn::MulAdd(q, z, hn::Set(d, 1.0f));
    // From the limit on (clamped arguments included) the correctly rounded tanh is exactly +-1; the ratio is not.
    const auto one = hn::CopySign(hn::Set(d, 1.0f), y);
    return hn::IfThenElse(hn::Ge(hn::Abs(y), hn::Set(d, tanh_float_limit)), one, hn::Div(hn::Mul(y, p), q));
}

// Soft-capping of count logits in place, x = cap * tanh(x * fl(1 / cap)) (two roundings in the quotient, the tanh,
// one product; TiledKernelInfo::tanh_max_ulps): -inf (a blocked key) and NaN (check_finite off) pass unchanged, and
// +-inf becomes +-cap. The tanh: tanh_float in float; Highway's Tanh in double, which sees |x / cap| <= 20 only:
// beyond 18.7 it returns +-1 exactly, and its Expm1 never meets an infinity or a NaN (whose float -> int step is
// undefined, as for Exp).
template <class D, class T = hn::TFromD<D>>
void soft_cap(D d, T* x, Index count, T cap) {
    const Index N = static_cast<Index>(hn::Lanes(d));
    constexpr T limit = std::is_same_v<T, float> ? tanh_float_limit : T(20);
    const auto c = hn::Set(d, cap), inv = hn::Set(d, T(1) / cap), lo = hn::Set(d, -limit), hi = hn::Set(d, limit);
    const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
    for (Index j = 0; j < count; j += N) {
        const auto s = hn::LoadU(d, x + j);
        const auto pass = hn::Or(hn::IsNaN(s), hn::Eq(s, neg_inf));
        const auto y = hn::Min(hn::Max(hn::IfThenZeroElse(pass, hn::Mul(s, inv)), lo), hi);
        hn::VFromD<D> t;
        if constexpr (std::is_same_v<T, float>) {
            t = tanh_float(d, y);
        } else {
            t = hn::Tanh(d, y);
        }
        hn::StoreU(hn::IfThenElse(pass, s, hn::Mul(c, t)), d, x + j);
    }
}

template <class T>
void soft_cap_any_count(T* x, Index count, T cap) {
    const hn::ScalableTag<T> d;
    const Index N = static_cast<Index>(hn::Lanes(d)), whole = count / N * N;
    soft_cap(d, x, whole, cap);
    soft_cap(hn::CappedTag<T, 1>(), x + whole, count - whole, cap);
}

// Step 3c's explicit bias: query lanes [0, valid) (query q0 + lane) and the readable keys keys[0, nbj) of batch
// element b, in the layout of s (key c, lane rr at bt[c * nr + rr]), widened to T; 0 where the lane may not read the
// key (outside its positional range [begin[rr], end[rr]) less k0, or a false in the mask) and in lanes past valid,
// so that a blocked logit stays -inf whatever the bias holds there. With `whole`, ALiBi's term is included
// (SdpaProblem::bias_at), for distances a vector of T cannot count exactly. The path of 16-bit storage and of
// check_finite off (where an allowed logit may be -inf too); transpose_bias is the fast one.
template <class S, class T>
void bias_tile(const SdpaProblem<S>& p, Index b, Index q0, Index valid, const Index* keys, Index nbj, Index nr,
               const Index* begin, const Index* end, Index k0, bool whole, T* bt) {
    std::fill_n(bt, nbj * nr, T(0));
    for (Index rr = 0; rr < valid; ++rr) {
        const Index i = q0 + rr;
        const Index c_begin = std::clamp<Index>(begin[rr] - k0, 0, nbj);
        const Index c_end = std::clamp<Index>(end[rr] - k0, c_begin, nbj);
        if (whole) {
            for (Index c = c_begin; c < c_end; ++c)
                if (p.mask_allows(b, i, keys[c])) bt[c * nr + rr] = p.bias_at(b, i, keys[c]);
            continue;
        }
        const BiasRow<S> row(p, b, i);
        for (Index c = c_begin; c < c_end; ++c)
            if (row.mask_allows(keys[c])) bt[c * nr + rr] = row.at(keys[c]);
    }
}

// Whether the readable keys keys[0, n) are consecutive (then a bias row holds them side by side).
inline bool consecutive(const Index* keys, Index n) { return n > 0 && keys[n - 1] - keys[0] == n - 1; }

// Step 3c's explicit bias as stored, for lanes [0, nr) and the readable keys keys[0, nbj), in the layout of s
// (bt[c * nr + rr]): lane rr reads the row at rows + min(rr, valid - 1) * row_stride (lanes past valid repeat the
// last query's row, in bounds), key j at + j * key_stride. A transpose (transpose_rows, `lane` its nr row pointers)
// where the keys are contiguous, else element by element. No mask is applied: see BiasSource::raw.
template <class T>
void transpose_bias(const T* rows, Index row_stride, Index key_stride, const Index* keys, Index nbj, Index nr,
                    Index valid, const T** lane, T* bt) {
    const auto row = [&](Index rr) { return rows + std::min(rr, valid - 1) * row_stride; };
    if (key_stride == 1 && consecutive(keys, nbj)) {
        for (Index rr = 0; rr < nr; ++rr) lane[rr] = row(rr) + keys[0];
        transpose_rows(lane, nr, nbj, bt);
        return;
    }
    for (Index c = 0; c < nbj; ++c)
        for (Index rr = 0; rr < nr; ++rr) bt[c * nr + rr] = row(rr)[keys[c] * key_stride];
}

// Where step 3c's additive term t comes from: the explicit bias in the layout of s (bias_tile, or with `raw`
// transpose_bias: as stored, blocked positions included, which is right only under check_finite, where a blocked
// logit and no allowed one is -inf, so blocked logits take 0 whatever the bias holds there), or none; then ALiBi's.
template <class T>
struct BiasSource {
    const T* tile = nullptr;
    bool raw = false;  // tile set, and only under check_finite
    bool alibi = false;
    T neg_slope = 0;       // -slope
    Index alibi_base = 0;  // lane rr's signed distance to key j is alibi_base + rr - j (exact in T: the caller's test)
};

// Step 3c's additions on the logits s (nbj keys keys[0, nbj), nr lanes): x' = x + t, or -inf where t = -inf (a -inf
// bias blocks its key). t is the explicit bias, ALiBi's fl(-slope * |distance|), or fl(bias + fl(-slope *
// |distance|)), the operations of SdpaProblem::bias_at. Blocked logits are -inf and get a finite t, so they stay
// -inf; lanes past `valid` (no query) get t = 0. Under `check`, returns the first lane below `valid` where a finite
// logit plus a finite t left the range (-1 if none).
template <class D, class T = hn::TFromD<D>>
Index add_bias(D d, T* s, const BiasSource<T>& src, Index nbj, Index nr, Index valid, const Index* keys, bool check) {
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
    const auto m = hn::Set(d, src.neg_slope);
    for (Index x = 0; x < nr; x += N) {
        const auto queries = hn::FirstN(d, static_cast<std::size_t>(std::max<Index>(valid - x, 0)));
        auto bad = hn::FirstN(d, 0);
        for (Index c = 0; c < nbj; ++c) {
            T* sc = s + c * nr + x;
            const auto xv = hn::LoadU(d, sc);
            auto t = hn::Zero(d);
            if (src.tile) t = hn::LoadU(d, src.tile + c * nr + x);
            if (src.raw) t = hn::IfThenZeroElse(hn::Eq(xv, neg_inf), t);
            if (src.alibi) {
                const auto a = hn::Mul(m, hn::Abs(hn::Iota(d, static_cast<T>(src.alibi_base + x - keys[c]))));
                t = src.tile ? hn::Add(t, a) : a;
            }
            t = hn::IfThenElseZero(queries, t);
            const auto blocks = hn::Eq(t, neg_inf);
            const auto y = hn::IfThenElse(blocks, neg_inf, hn::Add(xv, t));
            hn::StoreU(y, d, sc);
            if (check) bad = hn::Or(bad, hn::AndNot(blocks, hn::AndNot(hn::IsFinite(y), hn::IsFinite(xv))));
        }
        if (check && !hn::AllFalse(d, hn::And(bad, queries)))
            return x + static_cast<Index>(hn::FindFirstTrue(d, hn::And(bad, queries)));
    }
    return -1;
}

// add_bias for the explicit bias alone, transposed as stored (BiasSource::raw, so under check_finite): the same
// results with fewer operations. There every logit x is finite or -inf (blocked) and the bias t of an unblocked one
// finite or -inf (check_contracts refused NaN and +inf where a query reads), so with t zeroed where x is -inf the plain
// sum x + t is already -inf exactly where add_bias's would be. The overflow check keeps two running extremes per lane
// instead of mask logic per element: a sum overflowed upward when it is +inf (neither term is), downward when the sum
// of the two terms with -inf read as 0 is -inf.
// With Watch (the bias's values unread by the contract checks, Readability::values_deferred), throws ValuesNeedChecking
// where an unblocked logit of a query gets a bias that is not finite (-inf, +inf or NaN: t * 0 is NaN), before
// anything else: that entry may block a key, empty a row or be an error, which the checks decide.
template <bool Watch, class D, class T = hn::TFromD<D>>
Index add_raw_bias(D d, T* s, const T* tile, Index nbj, Index nr, Index valid) {
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
    const auto pos_inf = hn::Set(d, std::numeric_limits<T>::infinity());
    const auto zero = hn::Zero(d);
    for (Index x = 0; x < nr; x += N) {
        const auto queries = hn::FirstN(d, static_cast<std::size_t>(std::max<Index>(valid - x, 0)));
        auto hi = neg_inf, lo = pos_inf, unread = zero;
        for (Index c = 0; c < nbj; ++c) {
            T* sc = s + c * nr + x;
            const auto xv = hn::LoadU(d, sc);
            const auto blocked = hn::Eq(xv, neg_inf);
            const auto t = hn::IfThenElseZero(queries, hn::IfThenZeroElse(blocked, hn::LoadU(d, tile + c * nr + x)));
            const auto y = hn::Add(xv, t);
            hn::StoreU(y, d, sc);
            hi = hn::Max(hi, y);
            lo = hn::Min(lo, hn::Add(hn::IfThenZeroElse(blocked, xv), hn::IfThenZeroElse(hn::Eq(t, neg_inf), t)));
            if constexpr (Watch) unread = hn::MulAdd(t, zero, unread);
        }
        if constexpr (Watch)
            if (!hn::AllFalse(d, hn::IsNaN(unread))) throw ValuesNeedChecking{};
        const auto bad = hn::And(queries, hn::Or(hn::Eq(hi, pos_inf), hn::Eq(lo, neg_inf)));
        if (!hn::AllFalse(d, bad)) return x + static_cast<Index>(hn::FindFirstTrue(d, bad));
    }
    return -1;
}

// With `watch` (Readability::values_deferred, which only a raw explicit bias without ALiBi gets), add_raw_bias may
// throw ValuesNeedChecking.
template <class T>
Index add_bias_any_width(T* s, const BiasSource<T>& src, Index nbj, Index nr, Index valid, const Index* keys,
                         bool check, bool watch) {
    return with_lane_width<T>(nr, [&](auto d) {
        if (!src.raw || src.alibi) return add_bias(d, s, src, nbj, nr, valid, keys, check);
        return watch ? add_raw_bias<true>(d, s, src.tile, nbj, nr, valid)
                     : add_raw_bias<false>(d, s, src.tile, nbj, nr, valid);
    });
}


// What an item (query rows up to i1 of batch element b, reading readable keys [keys_begin, keys_end) in `panels`
// query panels) asks for a few cache lines per micro-kernel call while it computes (Ahead), where they lie in one
// contiguous range each: the next item's q rows (from i1, or batch element b + 1's first) and the k and v rows of
// the first key block after this item's that is not packed yet. Read at the start of the item that needs them,
// they would make it wait on memory with nothing to do meanwhile.
template <class S, class T>
Ahead item_ahead(const SdpaProblem<S>& p, const Layout& L, const Workspace<T>& w, Index b, Index i1, Index keys_begin,
                 Index keys_end, Index panels) {
    const Index Dk = p.Dk, Dv = p.Dv, n = L.n;
    Ahead ahead;
    Index bytes = 0;
    const auto ask = [&](const void* first, Index count) { ahead.add(first, count), bytes += count; };
    const Index q_next_b = i1 < p.Tq ? b : b + 1, q_next_i = i1 < p.Tq ? i1 : 0;
    if (p.q.stride(-1) == 1 && p.q.stride(-2) == Dk && q_next_b < p.batch)
        ask(p.q_row(q_next_b, q_next_i), std::min(L.Bq, p.Tq - q_next_i) * Dk * Index(sizeof(S)));
    const Index kb_next = keys_end > keys_begin ? (keys_end - 1) / L.Bk + 1 : 0;
    if (kb_next > 0 && kb_next * L.Bk < n && !is_packed(L, w, kb_next)) {
        const Index c0 = kb_next * L.Bk, nb = std::min(L.Bk, n - c0);
        if (consecutive(w.keys.data() + c0, nb)) {
            if (p.k.stride(-1) == 1 && p.k.stride(-2) == Dk) ask(p.k_row(b, w.keys[c0]), nb * Dk * Index(sizeof(S)));
            if (p.v.stride(-1) == 1 && p.v.stride(-2) == Dv) ask(p.v_row(b, w.keys[c0]), nb * Dv * Index(sizeof(S)));
        }
    }
    // Lines per step: the asked lines over the item's micro-kernel calls (both products of every tile).
    Index calls = 0;
    for (Index jq = 0; jq < panels; ++jq)
        calls += std::max<Index>(w.panel_end[jq] - w.panel_begin[jq], 0) / L.mr + 2 * L.dv_panels;
    ahead.lines_per_step = static_cast<int>(std::clamp<Index>(bytes / 64 / std::max<Index>(calls, 1) + 1, 1, 8));
    return ahead;
}

// Query rows [i0, i1) of batch element b; writes output rows (i1 - i0, Dv), rounded from T to the storage S once.
// One function of ~140 lines on purpose: it is the kernel's hot loop over key blocks, and its six steps (pack,
// scores, mask, online softmax, P V, normalise; numbered in the body) share the tile's workspace pointers, block
// bounds and row state: split, each step would take a dozen of them as arguments.
template <class S, class T>
void tile(const SdpaProblem<S>& p, const Readability& r, const SdpaOptions& options, Index b, Index i0, Index i1,
          const Layout& L, Workspace<T>& w, S* out, T* lse) {
    const Index Dk = p.Dk, Dv = p.Dv, mr = L.mr, nr = L.nr, n = L.n;
    const Index rows = i1 - i0, panels = (rows + nr - 1) / nr;
    const T neg_inf = -std::numeric_limits<T>::infinity();
    // ALiBi's distances |i + Tk - Tq - j| counted in vectors of T (step 3c): exact while every count, padding lanes
    // included, is below 2^digits (2^24 in float); beyond, bias_at per element.
    const bool alibi_in_vectors =
        p.alibi && p.Tq + p.Tk + 2 * nr < (Index(1) << std::numeric_limits<T>::digits);
    // The explicit bias transposed as stored (step 3c, transpose_bias): where a -inf logit is a blocked one
    // (check_finite), the bias is stored in the compute type and ALiBi's term, if any, comes in vectors; else
    // bias_tile.
    const bool bias_raw = p.bias && options.check_finite && std::is_same_v<S, T> && (!p.alibi || alibi_in_vectors);

    // 1. pack q^T: panel jq holds (dim p, query lane rr) at p * nr + rr, zero rows past i1.
    T* qp = w.qp.get(L.q_panels * L.ps_q);
    const Index qs = p.q.stride(-1);
    for (Index jq = 0; jq < panels; ++jq) {
        const auto lane = lane_rows<S>(
            w, nr, qs, Dk, [&](Index rr) { return jq * nr + rr < rows ? p.q_row(b, i0 + jq * nr + rr) : nullptr; },
            r.values_deferred, [&](Index rr) { return r.row_nonempty[static_cast<std::size_t>(i0 + jq * nr + rr)] != 0; });
        transpose_rows(lane, nr, Dk, qp + jq * L.ps_q);
    }
    T* acc = w.acc.get(L.q_panels * L.Dv_pad * nr);  // panel jq: (Dv_pad, nr)
    T* sp = w.sp.get(L.Bk_pad * nr);                 // (Bk_pad, nr): one tile's s^T, then p^T
    T* blk = w.blk.get(L.Dv_pad * nr);               // (Dv_pad, nr), like one panel of acc
    std::fill_n(acc, panels * L.Dv_pad * nr, T(0));
    std::fill_n(w.row_max.begin(), panels * nr, neg_inf);
    std::fill_n(w.row_sum.begin(), panels * nr, T(0));

    // Positional limits (causal rule, window) in readable-key positions, per row and per query panel: a panel's keys
    // run from its first row's begin to its last row's end, so (key panel, query panel) tiles that every row of the
    // panel is denied are never computed, and key blocks outside every panel's range are never visited.
    std::fill_n(w.row_begin.begin(), rows, 0);
    std::fill_n(w.row_end.begin(), rows, n);
    if (p.positions.restricts())
        for (Index i = 0; i < rows; ++i) {
            const KeyRange range = p.positions.keys(i0 + i, p.Tq, p.Tk);
            if (n == p.Tk) {  // every key readable: key j is readable key j (no search)
                w.row_begin[i] = std::clamp<Index>(range.begin, 0, n);
                w.row_end[i] = std::clamp<Index>(range.end, 0, n);
            } else {
                w.row_begin[i] = std::lower_bound(w.keys.begin(), w.keys.end(), range.begin) - w.keys.begin();
                w.row_end[i] = std::lower_bound(w.keys.begin(), w.keys.end(), range.end) - w.keys.begin();
            }
        }
    Index keys_begin = n, keys_end = 0;
    for (Index jq = 0; jq < panels; ++jq) {
        const Index lo = jq * nr, hi = std::min(rows, (jq + 1) * nr);
        const auto b_first = w.row_begin.begin() + lo, b_last = w.row_begin.begin() + hi;
        const auto e_first = w.row_end.begin() + lo, e_last = w.row_end.begin() + hi;
        w.panel_begin[jq] = *std::min_element(b_first, b_last);
        w.panel_all_from[jq] = *std::max_element(b_first, b_last);
        w.panel_end[jq] = *std::max_element(e_first, e_last);
        w.panel_all_see[jq] = *std::min_element(e_first, e_last);  // every row of the panel reads [all_from, all_see)
        if (w.panel_end[jq] > w.panel_begin[jq]) {
            keys_begin = std::min(keys_begin, w.panel_begin[jq]);
            keys_end = std::max(keys_end, w.panel_end[jq]);
        }
    }

    // The key blocks this item reads, packed when first read (pack_block).
    for (Index kb = keys_begin / L.Bk; kb * L.Bk < keys_end; ++kb)
        if (!is_packed(L, w, kb)) pack_block(p, r, kb, L, w);
    Ahead ahead = item_ahead(p, L, w, b, i1, keys_begin, keys_end, panels);
    for (Index c0 = keys_begin / L.Bk * L.Bk; c0 < keys_end; c0 += L.Bk) {
        const Index nb = std::min(L.Bk, n - c0);  // readable keys [c0, c0 + nb)
        const T* kblock = packed_k(L, w, c0 / L.Bk);
        const T* vblock = packed_v(L, w, c0 / L.Bk);
        // Under check_finite every readable value is finite; otherwise look, since 0 * NaN in the product would
        // carry a NaN/Inf value row into rows that may not read it.
        bool v_block_finite = true;
        if (!options.check_finite)
            for (Index c = c0; c < c0 + nb && v_block_finite; ++c)
                for (Index d = 0; d < Dv && v_block_finite; ++d)
                    v_block_finite = std::isfinite(p.v_row(b, w.keys[c])[d * p.v.stride(-1)]);
        for (Index jq = 0; jq < panels; ++jq) {
            // Keys [k0, k0 + nbj) of this block some row of the panel reads, k0 rounded down to a whole key panel.
            const Index lo = std::max<Index>(w.panel_begin[jq] - c0, 0), hi = std::min(nb, w.panel_end[jq] - c0);
            if (hi <= lo) continue;
            const Index cs = lo / mr * mr, k0 = c0 + cs, nbj = hi - cs;
            T* s = sp + cs * nr;  // key k0 + c, query lane rr at s[c * nr + rr]
            T* accj = acc + jq * L.Dv_pad * nr;
            if (bias_raw) {  // the next tile's bias (step 3c), the next panel's or the next block's first panel's
                const Index next = jq + 1, c0n = c0 + next / panels * L.Bk, jqn = next % panels;
                const Index nbn = std::min(L.Bk, n - c0n);
                const Index lon = std::max<Index>(w.panel_begin[jqn] - c0n, 0);
                const Index hin = std::min(nbn, w.panel_end[jqn] - c0n);
                // Contiguous keys only (transpose_bias's fast path), over this tile's micro-kernel calls.
                const Index* keys_n = c0n < keys_end && hin > lon ? w.keys.data() + c0n + lon / mr * mr : nullptr;
                const Index nbj_n = hin - lon / mr * mr;
                if (keys_n && p.bias_key_stride == 1 && consecutive(keys_n, nbj_n))
                    ahead.set_rows(p.bias_row(b, i0 + jqn * nr) + keys_n[0], nbj_n * Index(sizeof(S)),
                                   p.bias_row_stride * Index(sizeof(S)), std::min(nr, rows - jqn * nr),
                                   (nbj + mr - 1) / mr + L.dv_panels);
            }

            // 2. scores: s^T (nbj, nr) = scale * k[k0:k0+nbj] (nbj, Dk) @ q^T (Dk, nr), tile by tile.
            if (Dk > 0) {
                packed_gemm<T>((nbj + mr - 1) / mr, 1, Dk, static_cast<T>(p.scale), kblock + (cs / mr) * L.ps_k,
                               L.ps_k, qp + jq * L.ps_q, L.ps_q, T(0), s, nr, 1, mr * nr, 0, &ahead);
            } else {
                std::fill_n(s, nbj * nr, T(0));
            }

            // 3. mask: blocked -> -inf, only where a mask can block something (the diagonal or a window's edge, or an
            // explicit mask); every allowed logit must be finite.
            const bool position_cut = k0 < w.panel_all_from[jq] || k0 + nbj > w.panel_all_see[jq];
            if (position_cut || p.allowed_mask) {
                // One vector pass first: when every logit of the tile is finite, no allowed one needs a look.
                const bool tile_finite = !options.check_finite || all_finite(s, nbj * nr);
                // Each row's keys outside its range: in vectors (cut_positions, lanes past the rows cut nothing)
                // where the offsets are exact in T, else one by one.
                const bool cut_in_vectors = nbj < (Index(1) << std::numeric_limits<T>::digits);
                if (position_cut && cut_in_vectors) {
                    Index c_lo = 0, c_hi = nbj;
                    for (Index rr = 0; rr < nr; ++rr) {
                        const Index i = jq * nr + rr;
                        const Index begin = i < rows ? std::clamp<Index>(w.row_begin[i] - k0, 0, nbj) : 0;
                        const Index end = i < rows ? std::clamp<Index>(w.row_end[i] - k0, begin, nbj) : nbj;
                        w.cut_lo[rr] = static_cast<T>(begin), w.cut_hi[rr] = static_cast<T>(end);
                        c_lo = std::max(c_lo, begin), c_hi = std::min(c_hi, end);
                    }
                    cut_positions_any_width(s, nbj, nr, w.cut_lo.data(), w.cut_hi.data(), c_lo, c_hi);
                }
                for (Index rr = 0; rr < nr && jq * nr + rr < rows; ++rr) {
                    const Index i = jq * nr + rr;
                    const Index begin = std::clamp<Index>(w.row_begin[i] - k0, 0, nbj);
                    const Index end = std::clamp<Index>(w.row_end[i] - k0, begin, nbj);
                    if (!cut_in_vectors)
                        for (Index c = 0; c < begin; ++c) s[c * nr + rr] = neg_inf;
                    for (Index c = begin; c < end && (p.allowed_mask || !tile_finite); ++c) {
                        T& x = s[c * nr + rr];
                        // With the bias unread (Readability::values_deferred), the mask alone: a -inf bias entry
                        // must reach step 3c's watch, which hands the call back to the checks that read it.
                        const Index j = w.keys[k0 + c];
                        if (p.allowed_mask && !(r.values_deferred ? p.mask_allows(b, i0 + i, j) : p.allowed(b, i0 + i, j))) {
                            x = neg_inf;
                        } else if (options.check_finite && !std::isfinite(x)) {
                            throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b), i0 + i,
                                           p.shapes);
                        }
                    }
                    if (!cut_in_vectors)
                        for (Index c = end; c < nbj; ++c) s[c * nr + rr] = neg_inf;
                }
            } else if (options.check_finite && !all_finite(s, nbj * nr)) {
                for (Index rr = 0; rr < nr; ++rr)
                    for (Index c = 0; c < nbj; ++c)
                        if (!std::isfinite(s[c * nr + rr]))
                            throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b),
                                           i0 + jq * nr + rr, p.shapes);
            }

            // 3b. soft-capping of the allowed logits (blocked ones stay -inf), after the finiteness checks above.
            if (p.softcap != 0) soft_cap_any_count(s, nbj * nr, static_cast<T>(p.softcap));

            // 3c. the bias (explicit, ALiBi's, or both: SdpaProblem::bias_at), one addition per allowed logit after
            // the cap; a -inf bias blocks its key (the logit becomes -inf whatever it was); the sum of two finite
            // numbers may still overflow. The explicit bias is transposed into a tile like s, ALiBi's term computed in
            // vectors from its distances.
            if (p.has_bias()) {
                const Index r0 = jq * nr, valid = std::min(nr, rows - r0);
                BiasSource<T> src;
                if (p.bias || !alibi_in_vectors) {
                    T* bt = w.bias.get(L.Bk_pad * nr);
                    src.tile = bt;
                    src.raw = bias_raw;
                    if constexpr (std::is_same_v<S, T>)
                        if (bias_raw)
                            transpose_bias(p.bias_row(b, i0 + r0), p.bias_row_stride, p.bias_key_stride,
                                           w.keys.data() + k0, nbj, nr, valid, w.lanes.data(), bt);
                    if (!bias_raw)
                        bias_tile(p, b, i0 + r0, valid, w.keys.data() + k0, nbj, nr, w.row_begin.data() + r0,
                                  w.row_end.data() + r0, k0, p.alibi && !alibi_in_vectors, bt);
                }
                if (alibi_in_vectors) {
                    src.alibi = true, src.neg_slope = -p.alibi_slope(b);
                    src.alibi_base = i0 + r0 + p.Tk - p.Tq;
                }
                const Index bad = add_bias_any_width(s, src, nbj, nr, valid, w.keys.data() + k0, options.check_finite,
                                                     r.values_deferred);
                if (bad >= 0)
                    throw_overflow(p.function, "a logit plus its bias", p.batch_index_string(b), i0 + r0 + bad,
                                   p.shapes);
            }

            // 4. online softmax: s^T becomes p^T; acc and l are rescaled to the new max.
            online_softmax_any_width(s, nbj, nr, w.row_max.data() + jq * nr, w.row_sum.data() + jq * nr, accj,
                                     L.Dv_pad, !options.check_finite);

            // 5. acc^T (Dv, nr) += v^T[:, c0:c0+nbj] (Dv, nbj) @ p^T (nbj, nr): the block's product is formed on
            // its own in blk, then added to acc with one rounding per element (TiledKernelInfo: the block's partial
            // sums never include the running accumulator, whatever order the micro-kernel sums in).
            if (Dv == 0) continue;  // no value columns: nothing to accumulate (and no packed v to point into)
            if (v_block_finite) {
                packed_gemm<T>(L.dv_panels, 1, nbj, T(1), vblock + cs * mr, L.ps_v, s, 0, T(0), blk, nr,
                               1, mr * nr, 0, &ahead);
            } else {
                // A NaN/Inf value row that some query reads must not reach the rows of queries that may not read it
                // (pytorch#101967): each row sums over its own allowed keys only. blk (d, lane rr) at d * nr + rr.
                std::fill_n(blk, L.Dv_pad * nr, T(0));
                for (Index rr = 0; rr < nr && jq * nr + rr < rows; ++rr) {
                    const Index i = jq * nr + rr;
                    const Index begin = std::clamp<Index>(w.row_begin[i] - k0, 0, nbj);
                    const Index end = std::clamp<Index>(w.row_end[i] - k0, begin, nbj);
                    for (Index c = begin; c < end; ++c) {
                        if ((p.allowed_mask || p.bias) && !p.allowed(b, i0 + i, w.keys[k0 + c])) continue;
                        const T pc = s[c * nr + rr];
                        const S* vrow = p.v_row(b, w.keys[k0 + c]);
                        for (Index d = 0; d < Dv; ++d)
                            blk[d * nr + rr] += pc * static_cast<T>(vrow[d * p.v.stride(-1)]);
                    }
                }
            }
            for (Index x = 0; x < L.Dv_pad * nr; ++x) accj[x] += blk[x];
        }
    }

    // 6. normalise and transpose back to (rows, Dv); empty rows per policy; an overflowed output is an error. The
    // log-sum-exp m + log(l) when asked (-inf for an empty row).
    if (lse)
        for (Index i = 0; i < rows; ++i)
            lse[i] = r.row_nonempty[static_cast<std::size_t>(i0 + i)] ? w.row_max[i] + std::log(w.row_sum[i])
                                                                     : -std::numeric_limits<T>::infinity();
    if (Dv == 0) return;  // nothing to write, and acc holds no storage to index into
    // Per query panel: the division in the lanes, one transpose into the output rows (through blk and one SIMD
    // rounding into 16-bit storage when S is not T), then the rows the division does not give, and the overflow
    // check (in S: a 16-bit output may overflow where its float did not), row by row in order.
    for (Index jq = 0; jq < panels; ++jq) {
        const Index r0 = jq * nr, valid = std::min(nr, rows - r0);
        T* a = acc + jq * L.Dv_pad * nr;
        divide_lanes_any_width(a, w.row_sum.data() + r0, Dv, nr, w.over.data());
        for (Index dv = 0; dv < Dv; ++dv) w.lanes[dv] = a + dv * nr;
        if constexpr (std::is_same_v<S, T>) {
            transpose_rows(w.lanes.data(), Dv, valid, out + r0 * Dv);
        } else {
            transpose_rows(w.lanes.data(), Dv, valid, blk);  // blk holds Dv_pad * nr values
            narrow(blk, valid * Dv, out + r0 * Dv);
        }
        for (Index rr = 0; rr < valid; ++rr) {
            const Index i = r0 + rr;
            S* orow = out + i * Dv;
            if (!r.row_nonempty[static_cast<std::size_t>(i0 + i)]) {
                write_empty_row(options.empty_rows, orow, Dv, static_cast<S*>(nullptr), 0);
            } else if (w.row_sum[i] == T(0)) {
                // Every allowed logit of this row was -inf (an overflow, reachable only with check_finite off): the
                // softmax is undefined, NaN as in `reference`, without dividing by zero.
                std::fill_n(orow, Dv, static_cast<S>(std::numeric_limits<T>::quiet_NaN()));
            } else if (options.check_finite) {
                bool overflow = w.over[rr];
                if constexpr (!std::is_same_v<S, T>) {
                    // |x| <= max is false for NaN and both infinities; branch-free, so the compiler vectorises it.
                    int any = 0;
                    for (Index d = 0; d < Dv; ++d)
                        any |= !(std::fabs(static_cast<T>(orow[d])) <= std::numeric_limits<T>::max());
                    overflow = overflow || any;
                }
                if (overflow)
                    throw_overflow(p.function, "the output (weights @ v)", p.batch_index_string(b), i0 + i, p.shapes);
            }
        }
    }
}

// This thread's workspace, kept from call to call: its buffers (the packed keys and values of one batch element, 8 MB
// at Tk = 16384, D = 64 without a positional rule) would otherwise be allocated, paged in and freed by every call,
// which measured a sixth of a windowed call's time (T = 16384, window (256, 0), before its packed blocks shrank to
// slots). A new call marks the packed batch element stale.
// Calls of every storage type: float16 and float calls share Workspace<float>, so their numbers must differ.
std::atomic<std::uint64_t> tiled_calls{0};

template <class T>
Workspace<T>& thread_workspace(std::uint64_t call) {
    thread_local Workspace<T> w;
    if (w.call != call) w.call = call, w.b = -1;
    return w;
}

// The most key blocks of Bk that one item (Bq query rows) reads, for start_keys' slots: the union of its rows'
// positional ranges, empty ones included as tile() takes them, spans at most ceil(span / Bk) + 1 blocks, and no
// more in readable keys (unreadable keys only narrow a range). Every block of Tk without a positional rule.
template <class S>
Index blocks_per_item(const SdpaProblem<S>& p, Index Bq, Index Bk) {
    const Index all = (p.Tk + Bk - 1) / Bk;
    if (!p.positions.restricts()) return all;
    Index most = 0;
    for (Index i0 = 0; i0 < p.Tq; i0 += Bq) {
        Index begin = p.Tk, end = 0;
        for (Index i = i0; i < std::min(p.Tq, i0 + Bq); ++i) {
            const KeyRange range = p.positions.keys(i, p.Tq, p.Tk);
            begin = std::min(begin, range.begin), end = std::max(end, range.end);
        }
        if (end > begin) most = std::max(most, (end - begin + Bk - 1) / Bk + 1);
    }
    return std::min(all, most);
}

template <class S>
void sdpa_tiled_impl(const SdpaProblem<S>& p, const std::vector<Readability>& readable, const SdpaOptions& options,
                     S* output, compute_t<S>* lse) {
    using T = compute_t<S>;
    const MicroTile mt = micro_tile<T>();
    Layout base{};
    base.mr = mt.mr;
    base.nr = mt.nr;
    // make_sdpa_problem has checked both are >= 0.
    base.Bq = options.tiled_query_block > 0 ? options.tiled_query_block : tiled_query_block;
    base.Bk = options.tiled_key_block > 0 ? options.tiled_key_block : tiled_key_block;
    base.Bk_pad = round_up(base.Bk, base.mr);
    base.q_panels = (base.Bq + base.nr - 1) / base.nr;
    base.ps_q = round_up(std::max<Index>(p.Dk, 1) * base.nr, 16);
    base.ps_k = round_up(std::max<Index>(p.Dk, 1) * base.mr, 16);
    base.k_block_stride = (base.Bk_pad / base.mr) * base.ps_k;
    base.dv_panels = (p.Dv + base.mr - 1) / base.mr;
    base.Dv_pad = base.dv_panels * base.mr;
    base.item_blocks = blocks_per_item(p, base.Bq, base.Bk);

    const Index q_blocks = (p.Tq + base.Bq - 1) / base.Bq;
    const int threads = thread_count(options);
    const std::uint64_t call = ++tiled_calls;
    std::vector<Layout> layouts(static_cast<std::size_t>(threads), base);
    // Items (b, query block) in C order, handed out one at a time (causal items differ in cost): consecutive items
    // share b, so each thread packs the keys of a batch element about once.
    parallel_for(p.batch * q_blocks, threads, [&](Index item) {
#ifdef _OPENMP
        const auto t = static_cast<std::size_t>(omp_get_thread_num());
#else
        const std::size_t t = 0;
#endif
        Workspace<T>& w = thread_workspace<T>(call);
        Layout& L = layouts[t];
        const Index b = item / q_blocks, i0 = (item % q_blocks) * base.Bq, i1 = std::min(p.Tq, i0 + base.Bq);
        const Readability& r = readable[static_cast<std::size_t>(b)];
        if (w.b < 0) {  // this call's first item on this thread: sizes of this call's layout
            const auto lanes = static_cast<std::size_t>(base.q_panels * base.nr);
            for (auto* v : {&w.row_max, &w.row_sum}) v->resize(lanes);
            for (auto* v : {&w.row_begin, &w.row_end}) v->resize(lanes);
            for (auto* v : {&w.panel_begin, &w.panel_end, &w.panel_all_from, &w.panel_all_see})
                v->resize(static_cast<std::size_t>(base.q_panels));
            w.width = std::max<Index>({p.Dk, p.Dv, 1});
            const auto n = static_cast<std::size_t>(std::max(base.mr, base.nr));
            w.rows.resize(n * static_cast<std::size_t>(w.width));
            w.zeros.assign(static_cast<std::size_t>(w.width), T(0));
            w.lanes.resize(std::max<std::size_t>(n, static_cast<std::size_t>(p.Dv)));
            w.over.resize(static_cast<std::size_t>(base.nr));
            w.cut_lo.resize(static_cast<std::size_t>(base.nr));
            w.cut_hi.resize(static_cast<std::size_t>(base.nr));
        }
        if (w.b != b) start_keys(p, r, b, L, w);
        tile(p, r, options, b, i0, i1, L, w, output + b * p.Tq * p.Dv + i0 * p.Dv,
             lse ? lse + b * p.Tq + i0 : nullptr);
    }, Schedule::Dynamic);
}

template <class T>
void tiled_exp_impl(T* x, Index n) {
    const hn::ScalableTag<T> d;
    const Index N = static_cast<Index>(hn::Lanes(d));
    Index i = 0;
    for (; i + N <= n; i += N) hn::StoreU(kernel_exp(d, hn::LoadU(d, x + i)), d, x + i);
    const hn::CappedTag<T, 1> d1;
    for (; i < n; ++i) hn::StoreU(kernel_exp(d1, hn::LoadU(d1, x + i)), d1, x + i);
}

}  // namespace

// The per-target entry points HWY_EXPORT tabulates (plain functions: the table cannot hold templates).
void sdpa_tiled_float(const SdpaProblem<float>& p, const std::vector<Readability>& r, const SdpaOptions& o, float* out,
                      float* lse) {
    sdpa_tiled_impl(p, r, o, out, lse);
}
void sdpa_tiled_double(const SdpaProblem<double>& p, const std::vector<Readability>& r, const SdpaOptions& o,
                       double* out, double* lse) {
    sdpa_tiled_impl(p, r, o, out, lse);
}
void sdpa_tiled_float16(const SdpaProblem<float16>& p, const std::vector<Readability>& r, const SdpaOptions& o,
                        float16* out, float* lse) {
    sdpa_tiled_impl(p, r, o, out, lse);
}
void sdpa_tiled_bfloat16(const SdpaProblem<bfloat16>& p, const std::vector<Readability>& r, const SdpaOptions& o,
                         bfloat16* out, float* lse) {
    sdpa_tiled_impl(p, r, o, out, lse);
}
void tiled_exp_float(float* x, Index n) { tiled_exp_impl(x, n); }
void tiled_softcap_float(float* x, Index n, float cap) { soft_cap_any_count(x, n, cap); }
void tiled_softcap_double(double* x, Index n, double cap) { soft_cap_any_count(x, n, cap); }
void tiled_widen_float16(const float16* x, Index n, float* y) { widen(x, n, y); }
void tiled_widen_bfloat16(const bfloat16* x, Index n, float* y) { widen(x, n, y); }
void tiled_narrow_float16(const float* x, Index n, float16* y) { narrow(x, n, y); }
void tiled_narrow_bfloat16(const float* x, Index n, bfloat16* y) { narrow(x, n, y); }
void tiled_exp_double(double* x, Index n) { tiled_exp_impl(x, n); }
std::int64_t compiled_target() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {

HWY_EXPORT(sdpa_tiled_float);
HWY_EXPORT(sdpa_tiled_double);
HWY_EXPORT(sdpa_tiled_float16);
HWY_EXPORT(sdpa_tiled_bfloat16);
HWY_EXPORT(tiled_exp_float);
HWY_EXPORT(tiled_exp_double);
HWY_EXPORT(tiled_softcap_float);
HWY_EXPORT(tiled_softcap_double);
HWY_EXPORT(tiled_widen_float16);
HWY_EXPORT(tiled_widen_bfloat16);
HWY_EXPORT(tiled_narrow_float16);
HWY_EXPORT(tiled_narrow_bfloat16);
HWY_EXPORT(compiled_target);

template <>
void sdpa_tiled<float>(const SdpaProblem<float>& p, const std::vector<Readability>& r, const SdpaOptions& o,
                       float* out, float* lse) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(sdpa_tiled_float)(p, r, o, out, lse);
}
template <>
void sdpa_tiled<double>(const SdpaProblem<double>& p, const std::vector<Readability>& r, const SdpaOptions& o,
                        double* out, double* lse) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(sdpa_tiled_double)(p, r, o, out, lse);
}
template <>
void sdpa_tiled<float16>(const SdpaProblem<float16>& p, const std::vector<Readability>& r, const SdpaOptions& o,
                         float16* out, float* lse) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(sdpa_tiled_float16)(p, r, o, out, lse);
}
template <>
void sdpa_tiled<bfloat16>(const SdpaProblem<bfloat16>& p, const std::vector<Readability>& r, const SdpaOptions& o,
                          bfloat16* out, float* lse) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(sdpa_tiled_bfloat16)(p, r, o, out, lse);
}
template <>
void tiled_exp<float>(float* x, Index n) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_exp_float)(x, n);
}
template <>
void tiled_exp<double>(double* x, Index n) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_exp_double)(x, n);
}
template <>
void tiled_softcap<float>(float* x, Index n, float cap) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_softcap_float)(x, n, cap);
}
template <>
void tiled_softcap<double>(double* x, Index n, double cap) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_softcap_double)(x, n, cap);
}

template <>
void tiled_widen<float16>(const float16* x, Index n, float* y) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_widen_float16)(x, n, y);
}
template <>
void tiled_widen<bfloat16>(const bfloat16* x, Index n, float* y) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_widen_bfloat16)(x, n, y);
}
template <>
void tiled_narrow<float16>(const float* x, Index n, float16* y) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_narrow_float16)(x, n, y);
}
template <>
void tiled_narrow<bfloat16>(const float* x, Index n, bfloat16* y) {
    apply_simd_target_from_environment();
    HWY_DYNAMIC_DISPATCH(tiled_narrow_bfloat16)(x, n, y);
}

std::int64_t simd_compiled_targets() { return HWY_TARGETS; }
std::int64_t simd_dispatched_target() {
    apply_simd_target_from_environment();
    return HWY_DYNAMIC_DISPATCH(compiled_target)();
}

}  // namespace attn::detail
#endif  // HWY_ONCE
