// The suite's generators: shapes, values, masks and options, weighted toward the edges that break attention.
#include "generators.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/mask.hpp"
#include "attn/suite/recipe.hpp"

namespace attn::suite::gen {

double round_to(Dtype dtype, double x) { return round_to_dtype(dtype, x); }

const char* to_string(Values values) {
    switch (values) {
        case Values::Normal: return "normal";
        case Values::Uniform: return "uniform";
        case Values::Huge: return "huge";
        case Values::Tiny: return "tiny";
        case Values::Subnormal: return "subnormal";
        case Values::NearTies: return "near-ties";
        case Values::Ties: return "ties";
        case Values::LargeLogits: return "large-logits";
    }
    return "?";
}

namespace {

// The dtype's binary format: smallest subnormal and normal exponents, stored significand bits, largest finite value,
// machine epsilon.
struct Format {
    int min_subnormal_exp, min_normal_exp, mantissa_bits;
    double max, eps;
};
template <class T>
Format format_of() {
    using L = std::numeric_limits<T>;
    return {L::min_exponent - L::digits, L::min_exponent - 1, L::digits - 1, static_cast<double>(L::max()),
            static_cast<double>(L::epsilon())};
}
Format format(Dtype d) {
    switch (d) {
        case Dtype::Float: return format_of<float>();
        case Dtype::Double: return format_of<double>();
        case Dtype::Float16: return format_of<float16>();
        case Dtype::BFloat16: return format_of<bfloat16>();
    }
    return format_of<double>();
}
int min_subnormal_exp(Dtype d) { return format(d).min_subnormal_exp; }
int min_normal_exp(Dtype d) { return format(d).min_normal_exp; }
double max_finite(Dtype d) { return format(d).max; }
double epsilon(Dtype d) { return format(d).eps; }

double random_subnormal(Dtype d, Rng& rng) {
    const int mantissa_bits = format(d).mantissa_bits;
    const double m = static_cast<double>(1 + rng.below((std::uint64_t{1} << mantissa_bits) - 1));
    const double x = std::ldexp(m, min_subnormal_exp(d));
    return rng.below(2) ? -x : x;
}

}  // namespace

double min_normal(Dtype d) { return std::ldexp(1.0, min_normal_exp(d)); }
double log_max(Dtype d) { return std::log(max_finite(scale_is_float(d) ? Dtype::Float : d)); }

rc::Gen<double> special_value(Dtype dtype) {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    const double max = max_finite(dtype), eps = epsilon(dtype);
    const double min_sub = std::ldexp(1.0, min_subnormal_exp(dtype)), min_norm = std::ldexp(1.0, min_normal_exp(dtype));
    const double max_sub = min_norm - min_sub;
    return rc::gen::weightedOneOf<double>({
        {3, rc::gen::element(nan, -nan)},
        {3, rc::gen::element(inf, -inf)},
        {2, rc::gen::element(0.0, -0.0)},
        {3, rc::gen::element(min_sub, -min_sub, max_sub, -max_sub)},
        {2, rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [dtype](std::uint64_t s) {
             Rng rng(s);
             return random_subnormal(dtype, rng);
         })},
        {2, rc::gen::element(max, -max, min_norm, -min_norm)},
        {1, rc::gen::element(round_to(dtype, 1 + eps), round_to(dtype, 1 - eps / 2))},
        {2, rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [dtype](std::uint64_t s) {
             Rng rng(s);  // huge or tiny normal numbers of either sign
             const double e = rng.below(2) ? rng.uniform(10, 30) : -rng.uniform(10, 30);
             return round_to(dtype, (rng.below(2) ? -1 : 1) * rng.uniform(1, 10) * std::pow(10.0, e));
         })},
        {2, rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [dtype](std::uint64_t s) {
             Rng rng(s);
             return round_to(dtype, rng.normal());
         })},
    });
}

void fill_values(SdpaCase& c, Values values, std::uint64_t seed) {
    Rng rng(seed);
    const Dtype d = c.dtype;
    c.q = Tensor<double>({c.B, c.H, c.Tq, c.Dk});
    c.k = Tensor<double>({c.B, c.kv_heads, c.Tk, c.Dk});
    c.v = Tensor<double>({c.B, c.kv_heads, c.Tk, c.Dv});
    c.distribution = to_string(values);
    const auto each = [&](Tensor<double>& t, auto draw) {
        for (Index i = 0; i < t.numel(); ++i) t[i] = round_to(d, draw());
    };
    const auto normal = [&] { return rng.normal(); };
    switch (values) {
        case Values::Normal:
            each(c.q, normal), each(c.k, normal), each(c.v, normal);
            break;
        case Values::Uniform: {
            const double a = rng.uniform(0.1, 4.0);
            const auto u = [&] { return rng.uniform(-a, a); };
            each(c.q, u), each(c.k, u), each(c.v, u);
            break;
        }
        case Values::Huge: {
            // Magnitudes 1e2..1e8 (float16: ..2e3, below its 65504): logits far beyond exp's range, weights one-hot,
            // products still finite.
            const double m = std::pow(10.0, rng.uniform(2, std::min(8.0, std::log10(max_finite(d)) - 1.5)));
            const auto h = [&] { return m * rng.normal(); };
            each(c.q, h), each(c.k, h), each(c.v, h);
            break;
        }
        case Values::Tiny: {
            // 1e-5..1e-18 (float, bfloat16) or ..1e-150 (double): q k^T products fall into or below the subnormal
            // range. float16 1e-2..1e-7: its own subnormals (below 6.1e-5), as its products cannot reach float's.
            const double m = d == Dtype::Float16 ? std::pow(10.0, -rng.uniform(2, 7))
                                                 : std::pow(10.0, -rng.uniform(5, d == Dtype::Double ? 150 : 18));
            const auto t = [&] { return m * rng.normal(); };
            each(c.q, t), each(c.k, t), each(c.v, t);
            break;
        }
        case Values::Subnormal: {
            const auto s = [&] { return rng.uniform() < 0.4 ? random_subnormal(d, rng) : rng.normal(); };
            each(c.q, s), each(c.k, s), each(c.v, s);
            break;
        }
        case Values::NearTies: {
            // Keys within a few ulps of one base key: logits differ in their last bits only.
            each(c.q, normal), each(c.v, normal);
            std::vector<double> base(static_cast<std::size_t>(c.Dk));
            for (double& x : base) x = rng.normal();
            const double eps = epsilon(d);
            for (Index r = 0; r < c.k.numel() / c.Dk; ++r)
                for (Index x = 0; x < c.Dk; ++x)
                    c.k[r * c.Dk + x] = round_to(d, base[static_cast<std::size_t>(x)] * (1 + eps * static_cast<double>(rng.below(9)) - 4 * eps));
            break;
        }
        case Values::Ties: {
            // Keys drawn from a pool of ceil(Tk/3) rows: most rows have their maximum at several keys exactly.
            each(c.q, normal), each(c.v, normal);
            const Index pool = std::max<Index>(1, (c.Tk + 2) / 3);
            std::vector<double> rows(static_cast<std::size_t>(pool * c.Dk));
            for (double& x : rows) x = round_to(d, rng.normal());
            for (Index bh = 0; bh < c.B * c.kv_heads; ++bh)
                for (Index j = 0; j < c.Tk; ++j) {
                    const Index p = static_cast<Index>(rng.below(static_cast<std::uint64_t>(pool)));
                    for (Index x = 0; x < c.Dk; ++x) c.k[(bh * c.Tk + j) * c.Dk + x] = rows[static_cast<std::size_t>(p * c.Dk + x)];
                }
            break;
        }
        case Values::LargeLogits: {
            // Logits of typical size 0.5..4 times log(max): beyond exp's overflow threshold unless the row max is
            // subtracted first.
            const double L = log_max(d) * rng.uniform(0.5, 4.0);
            const double s = std::sqrt(L);  // logit = q.k / sqrt(Dk) has standard deviation s^2 = L
            const auto g = [&] { return s * rng.normal(); };
            each(c.q, g), each(c.k, g), each(c.v, normal);
            break;
        }
    }
}

Tensor<bool> random_allowed_mask(const Shape& shape, double density, Rng& rng) {
    Tensor<bool> m(shape);
    const Index Tk = shape.back();
    for (Index r = 0; r < m.numel() / std::max<Index>(Tk, 1); ++r) {
        bool any = false;
        for (Index j = 0; j < Tk; ++j) any |= (m[r * Tk + j] = rng.uniform() < density);
        if (!any && Tk > 0) m[r * Tk + static_cast<Index>(rng.below(static_cast<std::uint64_t>(Tk)))] = true;
    }
    return m;
}

namespace {

using rc::gen::inRange;

rc::Gen<Index> seq_length() {
    return rc::gen::weightedOneOf<Index>({{2, rc::gen::just<Index>(1)}, {6, inRange<Index>(2, 10)}, {2, inRange<Index>(10, 25)}});
}

// Key padding (B, 1, 1, Tk): real tokens first (padding at the tail) or scattered; at least one real key each.
Tensor<bool> padding_mask(Index B, Index Tk, bool prefix, bool force_pad, Rng& rng) {
    Tensor<bool> m({B, 1, 1, Tk});
    for (Index b = 0; b < B; ++b) {
        Index real = 1 + static_cast<Index>(rng.below(static_cast<std::uint64_t>(Tk)));
        if (force_pad && Tk > 1 && real == Tk) real = Tk - 1;
        if (prefix) {
            for (Index j = 0; j < Tk; ++j) m[b * Tk + j] = j < real;
        } else {
            std::vector<Index> order(static_cast<std::size_t>(Tk));
            for (Index j = 0; j < Tk; ++j) order[static_cast<std::size_t>(j)] = j;
            for (Index j = Tk - 1; j > 0; --j)
                std::swap(order[static_cast<std::size_t>(j)], order[rng.below(static_cast<std::uint64_t>(j + 1))]);
            for (Index j = 0; j < real; ++j) m[b * Tk + order[static_cast<std::size_t>(j)]] = true;
        }
    }
    return m;
}

// A random explicit mask of rank 2, 3 or 4 (size-1 dims broadcast), every row non-empty.
Tensor<bool> random_mask(const SdpaCase& c, int rank, double density, Rng& rng) {
    Shape shape;
    if (rank == 2) shape = {c.Tq, c.Tk};
    else if (rank == 3) shape = {rng.below(2) ? c.H : 1, c.Tq, c.Tk};
    else shape = {rng.below(2) ? c.B : 1, rng.below(2) ? c.H : 1, rng.below(4) ? c.Tq : 1, c.Tk};
    return random_allowed_mask(shape, density, rng);
}

// The parts of sdpa_case, each drawing from RapidCheck in the order sdpa_case calls them (so a seed gives the same
// cases as when they were one function).

// Shapes and K/V heads.
void draw_shapes(SdpaCase& c, const CaseSpec& spec) {
    // Shapes: edges (1) weighted against moderate sizes; one case in ten has Tk >= 64 so that the Tk*u term
    // of the bound matters.
    const bool long_rows = !spec.small && *rc::gen::weightedElement<int>({{9, 0}, {1, 1}}) == 1;
    c.B = *rc::gen::weightedElement<Index>({{3, 1}, {3, 2}, {1, 3}});
    c.H = *rc::gen::weightedElement<Index>({{3, 1}, {3, 2}, {1, 3}, {2, 4}, {1, 6}});
    c.Tq = *seq_length();
    const bool very_long = spec.very_long_keys && *rc::gen::weightedElement<int>({{9, 0}, {1, 1}}) == 1;
    c.Tk = long_rows ? *inRange<Index>(64, 97) : *seq_length();
    if (long_rows) c.B = 1, c.H = std::min<Index>(c.H, 2), c.Tq = std::min<Index>(c.Tq, 8);
    if (very_long) c.Tk = *inRange<Index>(257, 600), c.B = 1, c.H = 1, c.Tq = std::min<Index>(c.Tq, 4);
    if (spec.small) c.Tq = std::min<Index>(c.Tq, 9), c.Tk = std::min<Index>(c.Tk, 9);
    c.Dk = *rc::gen::weightedOneOf<Index>({{1, rc::gen::just<Index>(1)}, {6, inRange<Index>(2, 17)},
                                           {1, rc::gen::element<Index>(32, 64)}});
    c.Dv = *rc::gen::weightedOneOf<Index>({{1, rc::gen::just<Index>(1)}, {4, inRange<Index>(2, 17)}});
    if (spec.cross && c.Tq == c.Tk) c.Tk += 1;
    if (spec.self) c.Tk = c.Tq, c.Dv = c.Dk;
    // K/V heads: one per query head, one shared by all (stride 0), or grouped (GQA).
    c.kv_heads = c.H;
    if (spec.force_grouped && c.H == 1) c.H = *rc::gen::element<Index>(2, 3, 4, 6);
    if ((spec.grouped_kv || spec.force_grouped) && c.H > 1) {
        const int kv = spec.force_grouped ? *rc::gen::element(1, 2)
                                          : *rc::gen::weightedElement<int>({{6, 0}, {2, 1}, {2, 2}});
        if (kv == 1) c.kv_heads = 1;
        if (kv == 2) c.kv_heads = c.H % 2 == 0 && c.H > 2 ? c.H / 2 : (c.H % 3 == 0 && c.H > 3 ? c.H / 3 : 1);
    }
}

// The mask: its kind per spec, then the tensor (or the causal option); shapes may be adjusted to fit the kind.
void draw_mask(SdpaCase& c, const CaseSpec& spec, Rng& rng) {
    std::string kind;
    switch (spec.masks) {
        case Masks::Any:
            kind = *rc::gen::weightedElement<std::string>({{3, "none"}, {2, "causal-tl"}, {2, "causal-br"},
                                                           {2, "padding"}, {1, "causal-tl+padding"}, {3, "random"},
                                                           {2, "window"}, {1, "causal+window"}});
            break;
        case Masks::None: kind = "none"; break;
        case Masks::Blocking:
            kind = *rc::gen::weightedElement<std::string>({{2, "causal-tl"}, {2, "causal-br"}, {2, "padding"},
                                                           {1, "causal-tl+padding"}, {3, "random"}, {2, "window"},
                                                           {1, "causal+window"}});
            break;
        case Masks::Causal: kind = *rc::gen::element<std::string>("causal-tl", "causal-br"); break;
        case Masks::UnreadableKeys:
            kind = *rc::gen::element<std::string>("padding", "causal-tl+padding", "causal-tl-short", "window-short");
            break;
        case Masks::Explicit:
            kind = *rc::gen::weightedElement<std::string>({{1, "causal-tl"}, {1, "causal-br"}, {1, "padding"},
                                                           {1, "causal-tl+padding"}, {2, "random"}});
            break;
        case Masks::Broadcast: kind = *rc::gen::element<std::string>("padding", "random", "causal-tl"); break;
        case Masks::EmptyRows: kind = "empty-rows"; break;
        case Masks::Window: kind = *rc::gen::weightedElement<std::string>({{2, "window"}, {1, "causal+window"}}); break;
    }
    const bool explicit_only = spec.masks == Masks::Explicit || spec.masks == Masks::Broadcast;
    if (kind == "causal-tl-short") {
        // Top-left causal with Tk > Tq: keys Tq..Tk-1 are nobody's.
        kind = "causal-tl";
        if (c.Tk <= c.Tq) c.Tk = c.Tq + *inRange<Index>(1, 4);
    }
    // A bottom-right window, no mask, whose left side leaves the first keys nobody's (Tk > Tq + left below).
    const bool short_window = kind == "window-short";
    if (short_window) kind = "window";
    const bool windowed = kind == "window" || kind == "causal+window";
    // Tq <= Tk: then no window, causal rule or padding leaves a query row without a key.
    if ((kind == "causal-br" || kind == "causal-tl+padding" || windowed) && c.Tq > c.Tk) std::swap(c.Tq, c.Tk);
    if (spec.masks == Masks::Blocking || spec.masks == Masks::UnreadableKeys)
        if (c.Tk == 1) c.Tk = 2;
    if (kind == "causal-tl" && spec.masks == Masks::Blocking && c.Tq == 1) c.Tq = 2;
    if (kind == "causal-br" && spec.masks == Masks::Blocking && c.Tq == 1) c.Tq = 2, c.Tk = std::max<Index>(c.Tk, 2);
    if (spec.self) c.Tk = c.Tq;
    if (spec.cross && c.Tq == c.Tk) c.Tk += 1;
    if (windowed) {
        // The window option (FlashAttention's window_size), either alignment: sides around the micro-tile, small
        // enough that a window blocks something, or unbounded. With the causal rule of the same alignment too.
        const CausalAlignment a = *rc::gen::element(CausalAlignment::TopLeft, CausalAlignment::BottomRight);
        // Masks::Window also draws sides that span several of the tiled kernel's key blocks.
        const auto side = [&] {
            if (spec.masks == Masks::Window && *rc::gen::weightedElement<int>({{3, 0}, {1, 1}}) == 1)
                return *rc::gen::element<Index>(40, 130, 300);
            return *rc::gen::weightedElement<Index>({{1, -1}, {2, 0}, {2, 1}, {2, 3}, {1, 8}});
        };
        c.options.window = SlidingWindow{side(), side(), a};
        if (short_window) {
            const Index left = *inRange<Index>(0, 4);
            c.Tk = std::max(c.Tk, c.Tq + left + *inRange<Index>(1, 4));
            c.options.window = SlidingWindow{left, c.options.window->right, CausalAlignment::BottomRight};
        }
        if (kind == "causal+window") c.options.is_causal = true, c.options.alignment = a;
        if (spec.masks == Masks::Blocking) {
            // Blocking something: else the one-key band (0, 0), which blocks every key but one (Tk >= 2 here).
            const PositionRule rule{c.options.is_causal, a, c.options.window};
            bool blocks = false;
            for (Index i = 0; i < c.Tq && !blocks; ++i) blocks = rule.keys(i, c.Tq, c.Tk).end - rule.keys(i, c.Tq, c.Tk).begin < c.Tk;
            if (!blocks) c.options.window = SlidingWindow{0, 0, a};
        }
    } else if (kind == "causal-tl" || kind == "causal-br") {
        const CausalAlignment a = kind == "causal-tl" ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
        const bool as_tensor = explicit_only || *rc::gen::weightedElement<int>({{2, 0}, {1, 1}}) == 1;
        if (as_tensor) {
            c.allowed_mask = causal_allowed_mask(c.Tq, c.Tk, a);
        } else {
            c.options.is_causal = true;
            c.options.alignment = a;
        }
    } else if (kind == "padding") {
        c.allowed_mask = padding_mask(c.B, c.Tk, *rc::gen::arbitrary<bool>(),
                                      spec.masks == Masks::UnreadableKeys || spec.masks == Masks::Blocking, rng);
    } else if (kind == "causal-tl+padding") {
        const Tensor<bool> pad = padding_mask(c.B, c.Tk, true, spec.masks == Masks::UnreadableKeys, rng);
        const Tensor<bool> causal = causal_allowed_mask(c.Tq, c.Tk, CausalAlignment::TopLeft);
        c.allowed_mask = logical_and(pad.view(), causal.view());  // (B, 1, Tq, Tk)
    } else if (kind == "random") {
        const int rank = *rc::gen::element(2, 3, 4);
        const double density = *rc::gen::element(0.15, 0.5, 0.9);
        c.allowed_mask = random_mask(c, rank, density, rng);
        if (spec.masks == Masks::Blocking) {
            // At least one blocked position.
            Tensor<bool>& m = *c.allowed_mask;
            bool blocked = false;
            for (Index i = 0; i < m.numel(); ++i) blocked |= !m[i];
            if (!blocked) m[0] = false, m[1] = true;  // Tk >= 2 here
        }
    } else if (kind == "empty-rows") {
        // A random (B, H|1, Tq, Tk) mask with at least one all-false row.
        const int rank = *rc::gen::element(2, 4);
        const double density = *rc::gen::element(0.3, 0.8);
        Tensor<bool> m = random_mask(c, rank, density, rng);
        const Index rows = m.numel() / c.Tk;
        const Index empties = 1 + static_cast<Index>(rng.below(static_cast<std::uint64_t>(rows)));
        for (Index e = 0; e < empties; ++e) {
            const Index r = static_cast<Index>(rng.below(static_cast<std::uint64_t>(rows)));
            for (Index j = 0; j < c.Tk; ++j) m[r * c.Tk + j] = false;
        }
        c.allowed_mask = std::move(m);
        // Now and then a positional rule on top (it can only empty more rows): the library's Throw message must
        // then state the causal rule or the window with the sizes.
        const int rule = *rc::gen::weightedElement<int>({{4, 0}, {1, 1}, {1, 2}});
        const CausalAlignment a = *rc::gen::element(CausalAlignment::TopLeft, CausalAlignment::BottomRight);
        if (rule == 1) {
            c.options.is_causal = true, c.options.alignment = a;
            kind += a == CausalAlignment::TopLeft ? "+causal-tl" : "+causal-br";
        }
        if (rule == 2) c.options.window = SlidingWindow{*rc::gen::element<Index>(-1, 0, 2), *rc::gen::element<Index>(-1, 0, 2), a};
    }
    c.mask_kind = kind;
    if (c.allowed_mask && c.allowed_mask->rank() <= 4) {
        const int p = spec.masks == Masks::Broadcast ? 3 : 1;
        c.mask_stride0 = *rc::gen::weightedElement<int>({{4, 0}, {p, 1}}) == 1;
    }
}

// Scale, threads and the empty-row policy.
void draw_options(SdpaCase& c, Dtype dtype, const CaseSpec& spec) {
    if (*rc::gen::weightedElement<int>({{6, 0}, {1, 1}}) == 1)
        c.options.scale = round_to(dtype, *rc::gen::element(0.5, 1.0, 0.125, 2.0, 0.3));
    c.options.num_threads = *rc::gen::weightedElement<int>({{6, 0}, {1, 1}, {1, 2}, {1, 3}});
    if (spec.masks != Masks::EmptyRows && *rc::gen::weightedElement<int>({{3, 0}, {1, 1}}) == 1)
        c.options.empty_rows = EmptyRowPolicy::Zero;
    // Caps around the logits' sizes: far inside them (every logit saturates), near them, and beyond them.
    if (spec.force_softcap || (spec.softcap && *rc::gen::weightedElement<int>({{5, 0}, {1, 1}}) == 1))
        c.options.softcap = round_to(dtype, *rc::gen::element(0.05, 0.5, 2.0, 7.5, 30.0, 1e4));
}

}  // namespace

rc::Gen<SdpaCase> sdpa_case(Dtype dtype, CaseSpec spec) {
    return rc::gen::exec([dtype, spec] {
        SdpaCase c;
        c.dtype = dtype;
        draw_shapes(c, spec);
        // Values.
        const Values values = *rc::gen::weightedElement<Values>({{6, Values::Normal}, {2, Values::Uniform},
                                                                 {2, Values::Huge}, {2, Values::Tiny},
                                                                 {2, Values::Subnormal}, {2, Values::NearTies},
                                                                 {3, Values::Ties}, {3, Values::LargeLogits}});
        const std::uint64_t seed = *rc::gen::arbitrary<std::uint64_t>();
        Rng rng(seed ^ 0x5eedULL);
        draw_mask(c, spec, rng);
        fill_values(c, values, seed);
        c.aux_seed = *rc::gen::arbitrary<std::uint64_t>();
        draw_options(c, dtype, spec);
        if (spec.force_bias || (spec.bias && *rc::gen::weightedElement<int>({{4, 0}, {1, 1}}) == 1)) {
            Rng bias_rng(*rc::gen::arbitrary<std::uint64_t>());
            draw_bias(c, *rc::gen::elementOf(bias_kinds()), bias_rng);
        }
        if (spec.force_alibi || (spec.bias && *rc::gen::weightedElement<int>({{4, 0}, {1, 1}}) == 1)) {
            Rng alibi_rng(*rc::gen::arbitrary<std::uint64_t>());
            draw_alibi(c, *rc::gen::elementOf(alibi_kinds()), alibi_rng);
        }
        return c;
    });
}


}  // namespace attn::suite::gen
