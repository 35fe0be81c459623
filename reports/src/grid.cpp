// The report's grids and the seeded recipes for each input distribution.
#include "attn/report/grid.hpp"

#include <cmath>
#include <limits>
#include <sstream>

#include "attn/error.hpp"
#include "attn/mask.hpp"

namespace attn::report {

const char* to_string(Distribution distribution) {
    switch (distribution) {
        case Distribution::Normal: return "normal";
        case Distribution::LargeLogits: return "large-logits";
        case Distribution::NearTies: return "near-ties";
        case Distribution::WideRange: return "wide-range";
        case Distribution::Subnormal: return "subnormal";
    }
    return "?";
}

const char* to_string(MaskKind mask_kind) {
    switch (mask_kind) {
        case MaskKind::None: return "none";
        case MaskKind::CausalTopLeft: return "causal-tl";
        case MaskKind::CausalBottomRight: return "causal-br";
        case MaskKind::Padding: return "padding";
        case MaskKind::Random: return "random";
    }
    return "?";
}

const char* to_string(DType dtype) { return dtype == DType::Float ? "float" : "double"; }

const char* to_string(GridKind grid) {
    switch (grid) {
        case GridKind::Smoke: return "smoke";
        case GridKind::Quick: return "quick";
        case GridKind::Full: return "full";
    }
    return "?";
}

GridKind grid_from_string(const std::string& name) {
    for (GridKind g : {GridKind::Smoke, GridKind::Quick, GridKind::Full})
        if (name == to_string(g)) return g;
    throw ConfigError("report: unknown grid '" + name + "' (known: smoke, quick, full)");
}

namespace {

std::string shape_fields(const Case& c) {
    std::ostringstream s;
    s << "B=" << c.B << ",H=" << c.H << ",Tq=" << c.Tq << ",Tk=" << c.Tk << ",Dk=" << c.Dk << ",Dv=" << c.Dv
      << ",mask=" << to_string(c.mask_kind) << ",dist=" << to_string(c.distribution);
    if (c.distribution == Distribution::LargeLogits) s << ",logit_std=" << c.logit_std;
    return s.str();
}

}  // namespace

std::string config_string(const Case& c, const std::string& impl, DType dtype) {
    return "sdpa(" + shape_fields(c) + ",impl=" + impl + ",dtype=" + to_string(dtype) + ")";
}

std::string case_string(const Case& c) { return "sdpa(" + shape_fields(c) + ")"; }

// ---- grids ---------------------------------------------------------------------------------------------------
//
// The oracle dominates the cost: it does B*H*Tq*Tk*(Dk+Dv) multiply-adds in multiprecision per row, so the long
// sweeps keep Tq small (decoding-like, and Tq != Tk) and the distribution x mask cross product uses small shapes.

namespace {

const MaskKind all_masks[] = {MaskKind::None, MaskKind::CausalTopLeft, MaskKind::CausalBottomRight, MaskKind::Padding,
                              MaskKind::Random};
const Distribution all_distributions[] = {Distribution::Normal, Distribution::LargeLogits, Distribution::NearTies,
                                          Distribution::WideRange, Distribution::Subnormal};

struct Shape6 {
    Index B, H, Tq, Tk, Dk, Dv;
};

void add_sweeps(std::vector<Case>& cases, const std::vector<Index>& tks, const std::vector<Index>& dks,
                const std::vector<double>& logit_stds) {
    // H=4 and Dv >= 32 give every row at least 512 output elements, so its p99 is not just its max.
    for (Index Tk : tks) cases.push_back({"tk", 1, 4, 3, Tk, 64, 64, MaskKind::None, Distribution::Normal, 1});
    for (Index Dk : dks) cases.push_back({"dk", 1, 4, 5, 48, Dk, 32, MaskKind::None, Distribution::Normal, 1});
    for (double s : logit_stds)
        cases.push_back({"logit-scale", 1, 4, 4, 96, 32, 32, MaskKind::None, Distribution::LargeLogits, s});
}

void add_cross(std::vector<Case>& cases, const std::vector<Shape6>& shapes) {
    for (const Shape6& s : shapes)
        for (Distribution d : all_distributions)
            for (MaskKind m : all_masks) cases.push_back({"grid", s.B, s.H, s.Tq, s.Tk, s.Dk, s.Dv, m, d, 16});
}

std::vector<Index> powers_of_two(Index last) {
    std::vector<Index> r;
    for (Index n = 1; n <= last; n *= 2) r.push_back(n);
    return r;
}

// 1, 2, 3, 4, 6, 8, 12, ...: powers of two and three times powers of two, so block boundaries are crossed both ways.
std::vector<Index> dense_sizes(Index last) {
    std::vector<Index> r;
    for (Index n = 1; n <= last; n *= 2) {
        r.push_back(n);
        if (n >= 2 && 3 * n / 2 <= last) r.push_back(3 * n / 2);
    }
    return r;
}

}  // namespace

std::vector<Case> make_grid(GridKind grid) {
    std::vector<Case> cases;
    switch (grid) {
        case GridKind::Smoke:
            add_sweeps(cases, {1, 16, 100}, {1, 8}, {1, 64});
            add_cross(cases, {{2, 2, 7, 9, 16, 8}});
            break;
        case GridKind::Quick:
            add_sweeps(cases, powers_of_two(4096), powers_of_two(512), {0.25, 1, 4, 16, 64, 256, 1024});
            add_cross(cases, {{2, 2, 7, 9, 16, 8}, {1, 2, 33, 17, 24, 40}});
            break;
        case GridKind::Full:
            add_sweeps(cases, dense_sizes(16384), dense_sizes(1024),
                       {0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
            add_cross(cases, {{2, 2, 7, 9, 16, 8},
                              {1, 2, 33, 17, 24, 40},
                              {2, 3, 64, 200, 64, 64},
                              {1, 2, 1, 1000, 128, 128},
                              {3, 1, 100, 37, 8, 8}});
            break;
    }
    return cases;
}

// ---- inputs --------------------------------------------------------------------------------------------------

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): small, seedable, the same stream on every platform.
class Rng {
public:
    explicit Rng(std::uint64_t seed) : state_(seed) {}
    std::uint64_t next() {
        std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
    // Box-Muller; std::normal_distribution is not specified to give the same stream across library versions.
    double normal() {
        const double u1 = 1.0 - uniform();  // (0, 1]
        const double u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    bool coin() { return (next() >> 63) != 0; }

private:
    std::uint64_t state_;
};

// FNV-1a of the case string: the seed of a case.
std::uint64_t seed_of(const std::string& s) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

template <class T, class F>
Tensor<T> filled(Shape shape, F&& draw) {
    Tensor<T> t(std::move(shape));
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(draw());
    return t;
}

}  // namespace

template <class T>
Inputs<T> make_inputs(const Case& c) {
    Rng rng(seed_of(case_string(c)));
    const Shape q_shape{c.B, c.H, c.Tq, c.Dk}, k_shape{c.B, c.H, c.Tk, c.Dk}, v_shape{c.B, c.H, c.Tk, c.Dv};
    const double tiny = static_cast<double>(std::numeric_limits<T>::min());  // smallest normal of T
    const auto normal = [&] { return rng.normal(); };
    const auto signed_binades = [&](double lo, double hi) {
        return (rng.coin() ? -1.0 : 1.0) * std::exp2(lo + (hi - lo) * rng.uniform());
    };
    // 2^-1 .. 2^-24 below the smallest normal: subnormal (a few round to zero, also a case worth having).
    const auto subnormal = [&] { return rng.normal() * tiny * std::exp2(-1.0 - 23.0 * rng.uniform()); };

    Inputs<T> in;
    switch (c.distribution) {
        case Distribution::Normal:
            in.q = filled<T>(q_shape, normal);
            in.k = filled<T>(k_shape, normal);
            in.v = filled<T>(v_shape, normal);
            break;
        case Distribution::LargeLogits: {
            // logit = (q . k) / sqrt(Dk) has variance var(q) var(k) for independent entries.
            const double s = std::sqrt(c.logit_std);
            in.q = filled<T>(q_shape, [&] { return s * rng.normal(); });
            in.k = filled<T>(k_shape, [&] { return s * rng.normal(); });
            in.v = filled<T>(v_shape, normal);
            break;
        }
        case Distribution::NearTies: {
            in.q = filled<T>(q_shape, normal);
            // k (B, H, Tk, Dk): every key row is the first one times (1 + 2^-18 noise).
            in.k = Tensor<T>(k_shape);
            std::vector<double> first(static_cast<std::size_t>(c.Dk));
            for (Index bh = 0; bh < c.B * c.H; ++bh) {
                for (double& x : first) x = rng.normal();
                for (Index j = 0; j < c.Tk; ++j)
                    for (Index d = 0; d < c.Dk; ++d)
                        in.k[(bh * c.Tk + j) * c.Dk + d] = static_cast<T>(
                            first[static_cast<std::size_t>(d)] * (1.0 + 0x1.0p-18 * rng.normal()));
            }
            in.v = filled<T>(v_shape, normal);
            break;
        }
        case Distribution::WideRange:
            // Four binades in q and k keep several keys in play (twenty would make every softmax one-hot and
            // every output an exact copy of a value row); forty binades in v.
            in.q = filled<T>(q_shape, [&] { return signed_binades(-3, 1); });
            in.k = filled<T>(k_shape, [&] { return signed_binades(-3, 1); });
            in.v = filled<T>(v_shape, [&] { return signed_binades(-20, 20); });
            break;
        case Distribution::Subnormal: {
            const auto mixed = [&] { return rng.uniform() < 0.25 ? subnormal() : rng.normal(); };
            in.q = filled<T>(q_shape, mixed);
            in.k = filled<T>(k_shape, mixed);
            in.v = filled<T>(v_shape, subnormal);
            break;
        }
    }

    in.options.empty_rows = EmptyRowPolicy::Zero;
    switch (c.mask_kind) {
        case MaskKind::None: break;
        case MaskKind::CausalTopLeft:
            in.options.is_causal = true;
            in.options.alignment = CausalAlignment::TopLeft;
            break;
        case MaskKind::CausalBottomRight:
            in.options.is_causal = true;
            in.options.alignment = CausalAlignment::BottomRight;
            break;
        case MaskKind::Padding: {
            // allowed (B, 1, 1, Tk): batch b keeps its first Tk - (b+1) Tk / (2B+2) keys (at least one).
            Tensor<bool> allowed(Shape{c.B, 1, 1, c.Tk}, false);
            for (Index b = 0; b < c.B; ++b) {
                const Index keep = std::max<Index>(1, c.Tk - (b + 1) * c.Tk / (2 * c.B + 2));
                for (Index j = 0; j < keep; ++j) allowed[b * c.Tk + j] = true;
            }
            in.allowed_mask = std::move(allowed);
            break;
        }
        case MaskKind::Random: {
            // allowed (B, H, Tq, Tk): fair coins; a row left empty gets one key back, so every row is defined.
            Tensor<bool> allowed(Shape{c.B, c.H, c.Tq, c.Tk}, false);
            for (Index row = 0; row < c.B * c.H * c.Tq; ++row) {
                bool any = false;
                for (Index j = 0; j < c.Tk; ++j) any |= (allowed[row * c.Tk + j] = rng.coin());
                if (!any) allowed[row * c.Tk + static_cast<Index>(rng.next() % static_cast<std::uint64_t>(c.Tk))] = true;
            }
            in.allowed_mask = std::move(allowed);
            break;
        }
    }
    return in;
}

template Inputs<float> make_inputs<float>(const Case&);
template Inputs<double> make_inputs<double>(const Case&);

}  // namespace attn::report
