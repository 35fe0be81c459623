// The report's grids and the config strings (with their seeds) of their rows.
#include "attn/report/grid.hpp"

#include <cmath>
#include <limits>
#include <sstream>

#include "attn/error.hpp"

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
        case MaskKind::Window: return "window";
    }
    return "?";
}

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

const MaskKind all_masks[] = {MaskKind::None,    MaskKind::CausalTopLeft, MaskKind::CausalBottomRight,
                              MaskKind::Padding, MaskKind::Random,        MaskKind::Window};
const Distribution all_distributions[] = {Distribution::Normal, Distribution::LargeLogits, Distribution::NearTies,
                                          Distribution::WideRange, Distribution::Subnormal};

std::string seed_text(const Case& c) {
    std::ostringstream s;
    s << "sdpa(B=" << c.B << ",H=" << c.H << ",Tq=" << c.Tq << ",Tk=" << c.Tk << ",Dk=" << c.Dk << ",Dv=" << c.Dv
      << ",mask=" << to_string(c.mask_kind) << ",dist=" << to_string(c.distribution);
    if (c.distribution == Distribution::LargeLogits) s << ",logit_std=" << c.logit_std;
    if (c.softcap != 0) s << ",softcap=" << c.softcap;
    if (c.bias != "none") s << ",bias=" << c.bias;
    if (c.alibi != "none") s << ",alibi=" << c.alibi;
    s << ")";
    return s.str();
}

namespace {

// FNV-1a, 64 bits.
std::uint64_t fnv1a(const std::string& s) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

}  // namespace

suite::CaseConfig row_config(const Case& c, const std::string& impl, Dtype dtype) {
    suite::CaseConfig config;
    config.B = c.B, config.H = c.H, config.Tq = c.Tq, config.Tk = c.Tk, config.Dk = c.Dk, config.Dv = c.Dv;
    config.kv_heads = c.H;
    config.mask = to_string(c.mask_kind);
    // The padding (B, 1, 1, Tk) and random (B, H, Tq, Tk) masks are rank-4 tensors; causal masks are the option.
    config.mask_rank = c.mask_kind == MaskKind::Padding || c.mask_kind == MaskKind::Random ? 4 : 0;
    if (c.mask_kind == MaskKind::Window) config.window = SlidingWindow{4, 1, CausalAlignment::BottomRight};
    config.dtype = dtype;
    config.values = to_string(c.distribution);
    if (c.distribution == Distribution::LargeLogits) config.logit_std = c.logit_std;
    // The cap is a value of the type the logits are computed in (float for all but double), as a scale is.
    if (c.softcap != 0)
        config.softcap = suite::scale_is_float(dtype) ? static_cast<double>(static_cast<float>(c.softcap)) : c.softcap;
    config.bias = c.bias;
    config.alibi = c.alibi;
    config.seed = fnv1a(seed_text(c));
    config.empty_rows = EmptyRowPolicy::Zero;
    config.impl = impl;
    return config;
}

std::string config_string(const Case& c, const std::string& impl, Dtype dtype) {
    return row_config(c, impl, dtype).to_config();
}

void case_from_config(const std::string& config, Case& c, std::string& impl, Dtype& dtype) {
    suite::CaseConfig k;
    try {
        k = suite::parse_config(config);
    } catch (const Error& e) {
        throw IoError(std::string("report: accuracy.json: a row's config does not parse: ") + e.what());
    }
    const auto kind = [&](const std::string& name, const auto& all, const char* what) {
        for (auto e : all)
            if (name == to_string(e)) return e;
        throw IoError("report: accuracy.json: row " + config + " has no report " + what + " '" + name + "'");
    };
    c.B = k.B, c.H = k.H, c.Tq = k.Tq, c.Tk = k.Tk, c.Dk = k.Dk, c.Dv = k.Dv;
    c.mask_kind = kind(k.mask, all_masks, "mask");
    c.distribution = kind(k.values, all_distributions, "distribution");
    c.logit_std = k.logit_std.value_or(1.0);
    c.softcap = k.softcap.value_or(0.0);  // as the row computed with it: rounded to float for all but double
    c.bias = k.bias;
    c.alibi = k.alibi;
    impl = k.impl;
    dtype = k.dtype;
}

// ---- grids ---------------------------------------------------------------------------------------------------
//
// The oracle dominates the cost: it does B*H*Tq*Tk*(Dk+Dv) multiply-adds in multiprecision per row, so the long
// sweeps keep Tq small (decoding-like, and Tq != Tk) and the distribution x mask cross product uses small shapes.

namespace {

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

// Soft-capped rows: each cap against logits from standard normal to far beyond it (every logit saturated), with the
// causal rule and without.
void add_softcap(std::vector<Case>& cases, const std::vector<double>& caps, const std::vector<double>& logit_stds) {
    for (double cap : caps)
        for (double s : logit_stds)
            for (MaskKind m : {MaskKind::None, MaskKind::CausalBottomRight}) {
                Case c{"softcap", 1, 4, 8, 96, 32, 32, m, Distribution::LargeLogits, s};
                c.softcap = cap;
                cases.push_back(c);
            }
}

// Biased rows: every bias kind of the suite's recipes (normal, +-1000, an ALiBi-like ramp, one per key, one per query
// row, one (Tq, Tk) for all heads), ALiBi's standard slopes and slopes per batch element, and a bias with ALiBi after Gemma 2's cap of 50; with
// logits of each standard deviation and each mask.
void add_bias(std::vector<Case>& cases, const std::vector<double>& logit_stds, const std::vector<MaskKind>& masks) {
    struct Variant {
        const char* bias;
        const char* alibi;
        double softcap;
    };
    const Variant variants[] = {{"normal", "none", 0}, {"large", "none", 0}, {"alibi", "none", 0},
                                {"keys", "none", 0},   {"rows", "none", 0},  {"matrix", "none", 0},
                                {"none", "heads", 0},  {"none", "batch", 0}, {"normal", "heads", 50}};
    for (const Variant& v : variants)
        for (double s : logit_stds)
            for (MaskKind m : masks) {
                Case c{"bias", 2, 4, 8, 64, 32, 32, m, Distribution::LargeLogits, s};
                c.bias = v.bias, c.alibi = v.alibi, c.softcap = v.softcap;
                cases.push_back(c);
            }
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
            add_softcap(cases, {0.1, 1, 5, 50}, {1, 64});
            add_bias(cases, {1}, {MaskKind::CausalBottomRight});
            add_cross(cases, {{2, 2, 7, 9, 16, 8}, {1, 2, 33, 17, 24, 40}});
            break;
        case GridKind::Full:
            add_sweeps(cases, dense_sizes(16384), dense_sizes(1024),
                       {0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
            add_softcap(cases, {0.05, 0.1, 0.5, 1, 5, 20, 50}, {1, 16, 256});
            add_bias(cases, {1, 64}, {MaskKind::None, MaskKind::CausalBottomRight, MaskKind::Padding});
            add_cross(cases, {{2, 2, 7, 9, 16, 8},
                              {1, 2, 33, 17, 24, 40},
                              {2, 3, 64, 200, 64, 64},
                              {1, 2, 1, 1000, 128, 128},
                              {3, 1, 100, 37, 8, 8}});
            break;
    }
    return cases;
}

}  // namespace attn::report
