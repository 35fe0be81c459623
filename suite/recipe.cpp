// The recipes of attn/suite/recipe.hpp: a config string with a seed -> its case.
#include "attn/suite/recipe.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/sdpa.hpp"
#include "attn/suite/rng.hpp"
#include "generators.hpp"

namespace attn::suite {

namespace {

// The recipes' normal: Box-Muller with u1 = 1 - U in (0, 1]; not Rng::normal, whose stream differs (it draws u1
// from U and skips 0), because the report's rows, compared across runs, were drawn with this one.
double recipe_normal(Rng& rng) {
    const double u1 = 1.0 - rng.uniform();
    const double u2 = rng.uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
bool coin(Rng& rng) { return (rng.next() >> 63) != 0; }  // the top bit

[[noreturn]] void no_recipe(const CaseConfig& c, const std::string& what) {
    throw ConfigError("config string '" + c.to_config() + "': " + what);
}

template <class F>
Tensor<double> filled(Dtype dtype, Shape shape, F&& draw) {
    Tensor<double> t(std::move(shape));
    for (Index i = 0; i < t.numel(); ++i) t[i] = gen::round_to(dtype, draw());
    return t;
}

void draw_values(SdpaCase& c, Rng& rng) {
    const Dtype d = c.dtype;
    const Shape q_shape{c.B, c.H, c.Tq, c.Dk}, k_shape{c.B, c.kv_heads, c.Tk, c.Dk}, v_shape{c.B, c.kv_heads, c.Tk, c.Dv};
    const double tiny = gen::min_normal(d);  // smallest normal of the dtype
    const auto normal = [&] { return recipe_normal(rng); };
    const auto signed_binades = [&](double lo, double hi) {
        return (coin(rng) ? -1.0 : 1.0) * std::exp2(lo + (hi - lo) * rng.uniform());
    };
    // 2^-1 .. 2^-24 below the smallest normal: subnormal (a few round to zero, also a case worth having). The 16-bit
    // types have fewer subnormal binades (10 and 7): theirs.
    const double sub_binades = d == Dtype::Float16 ? 10.0 : d == Dtype::BFloat16 ? 7.0 : 23.0;
    const auto subnormal = [&] { return recipe_normal(rng) * tiny * std::exp2(-1.0 - sub_binades * rng.uniform()); };
    const std::string& values = c.distribution;
    if (values == "normal") {
        c.q = filled(d, q_shape, normal);
        c.k = filled(d, k_shape, normal);
        c.v = filled(d, v_shape, normal);
    } else if (values == "large-logits") {
        if (!c.logit_std) no_recipe(config_of(c, "?"), "values=large-logits needs logit_std");
        // logit = (q . k) / sqrt(Dk) has variance var(q) var(k) for independent entries.
        const double s = std::sqrt(*c.logit_std);
        c.q = filled(d, q_shape, [&] { return s * recipe_normal(rng); });
        c.k = filled(d, k_shape, [&] { return s * recipe_normal(rng); });
        c.v = filled(d, v_shape, normal);
    } else if (values == "near-ties") {
        c.q = filled(d, q_shape, normal);
        c.k = Tensor<double>(k_shape);
        std::vector<double> first(static_cast<std::size_t>(c.Dk));
        for (Index bh = 0; bh < c.B * c.kv_heads; ++bh) {
            for (double& x : first) x = recipe_normal(rng);
            for (Index j = 0; j < c.Tk; ++j)
                for (Index x = 0; x < c.Dk; ++x) {
                    const double y = first[static_cast<std::size_t>(x)] * (1.0 + 0x1.0p-18 * recipe_normal(rng));
                    c.k[(bh * c.Tk + j) * c.Dk + x] = gen::round_to(d, y);
                }
        }
        c.v = filled(d, v_shape, normal);
    } else if (values == "wide-range") {
        // Four binades in q and k keep several keys in play (twenty would make every softmax one-hot and every
        // output an exact copy of a value row); forty binades in v.
        c.q = filled(d, q_shape, [&] { return signed_binades(-3, 1); });
        c.k = filled(d, k_shape, [&] { return signed_binades(-3, 1); });
        // float16 (largest finite 65504) takes the same forty binades 5 lower: 2^-25 .. 2^15.
        const double v_scale = d == Dtype::Float16 ? 0x1p-5 : 1.0;
        c.v = filled(d, v_shape, [&] { return v_scale * signed_binades(-20, 20); });
    } else if (values == "subnormal") {
        const auto mixed = [&] { return rng.uniform() < 0.25 ? subnormal() : recipe_normal(rng); };
        c.q = filled(d, q_shape, mixed);
        c.k = filled(d, k_shape, mixed);
        c.v = filled(d, v_shape, subnormal);
    } else {
        no_recipe(config_of(c, "?"), "no recipe for values=" + values +
                                         " (known: normal, large-logits, near-ties, wide-range, subnormal)");
    }
}

void draw_mask(SdpaCase& c, const CaseConfig& config, Rng& rng) {
    const std::string& kind = config.mask;
    if (config.mask_stride0) no_recipe(config, "no recipe for a stride-0 mask view");
    if ((kind == "causal-tl" || kind == "causal-br") && (config.mask_rank == 0 || config.mask_rank == 2)) {
        const CausalAlignment a = kind == "causal-tl" ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
        if (config.mask_rank == 2) {
            c.allowed_mask = causal_allowed_mask(c.Tq, c.Tk, a);
        } else {
            c.options.is_causal = true;
            c.options.alignment = a;
        }
    } else if (kind == "padding" && config.mask_rank == 4) {
        Tensor<bool> allowed(Shape{c.B, 1, 1, c.Tk}, false);
        for (Index b = 0; b < c.B; ++b) {
            const Index keep = std::max<Index>(1, c.Tk - (b + 1) * c.Tk / (2 * c.B + 2));
            for (Index j = 0; j < keep; ++j) allowed[b * c.Tk + j] = true;
        }
        c.allowed_mask = std::move(allowed);
    } else if (kind == "random" && config.mask_rank == 4) {
        Tensor<bool> allowed(Shape{c.B, c.H, c.Tq, c.Tk}, false);
        for (Index row = 0; row < c.B * c.H * c.Tq; ++row) {
            bool any = false;
            for (Index j = 0; j < c.Tk; ++j) any |= (allowed[row * c.Tk + j] = coin(rng));
            if (!any) allowed[row * c.Tk + static_cast<Index>(rng.next() % static_cast<std::uint64_t>(c.Tk))] = true;
        }
        c.allowed_mask = std::move(allowed);
    } else if (kind == "window" && config.mask_rank == 0) {
        if (!config.window) no_recipe(config, "mask=window needs its window=LEFT:RIGHT:tl|br field");
    } else if (kind != "none" || config.mask_rank != 0) {
        no_recipe(config, "no recipe for mask=" + kind + (config.mask_rank ? "-r" + std::to_string(config.mask_rank) : "") +
                              " (known: none, causal-tl, causal-br, causal-tl-r2, causal-br-r2, padding-r4, random-r4, "
                              "window)");
    }
}

}  // namespace

const std::vector<std::string>& bias_kinds() {
    static const std::vector<std::string> kinds = {"normal", "large", "alibi", "keys", "rows", "matrix"};
    return kinds;
}

void draw_bias(SdpaCase& c, const std::string& kind, Rng& rng) {
    c.bias_kind = kind;
    const Dtype d = c.dtype;
    if (kind == "none") {
        c.bias.reset();
    } else if (kind == "normal") {
        c.bias = filled(d, {c.B, c.H, c.Tq, c.Tk}, [&] { return 2 * recipe_normal(rng); });
    } else if (kind == "large") {
        c.bias = filled(d, {c.B, c.H, c.Tq, c.Tk}, [&] { return rng.uniform(-1000.0, 1000.0); });
    } else if (kind == "alibi") {
        Tensor<double> t({c.H, c.Tq, c.Tk});
        for (Index h = 0; h < c.H; ++h) {
            const double slope = std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(c.H));
            for (Index i = 0; i < c.Tq; ++i)
                for (Index j = 0; j < c.Tk; ++j)
                    t[(h * c.Tq + i) * c.Tk + j] =
                        gen::round_to(d, -slope * std::fabs(static_cast<double>(i + c.Tk - c.Tq - j)));
        }
        c.bias = std::move(t);
    } else if (kind == "keys") {
        c.bias = filled(d, {c.B, 1, 1, c.Tk}, [&] { return 2 * recipe_normal(rng); });
    } else if (kind == "rows") {
        c.bias = filled(d, {c.Tq, 1}, [&] { return 10 * recipe_normal(rng); });
    } else if (kind == "matrix") {  // PyTorch's usual float attn_mask: one (Tq, Tk) for every batch element and head
        c.bias = filled(d, {c.Tq, c.Tk}, [&] { return 2 * recipe_normal(rng); });
    } else {
        std::string known = "none";
        for (const std::string& k : bias_kinds()) known += ", " + k;
        throw ConfigError("suite case: no bias kind '" + kind + "' (known: " + known + ")");
    }
}

const std::vector<std::string>& alibi_kinds() {
    static const std::vector<std::string> kinds = {"heads", "batch"};
    return kinds;
}

void draw_alibi(SdpaCase& c, const std::string& kind, Rng& rng) {
    c.alibi_kind = kind;
    if (kind == "none") {
        c.alibi_slopes.reset();
    } else if (kind == "heads") {
        const std::vector<double> standard = alibi_slopes(c.H);
        Tensor<double> t({c.H});
        for (Index h = 0; h < c.H; ++h) t[h] = gen::round_to(c.dtype, standard[static_cast<std::size_t>(h)]);
        c.alibi_slopes = std::move(t);
    } else if (kind == "batch") {
        c.alibi_slopes = filled(c.dtype, {c.B, c.H}, [&] { return std::exp2(rng.uniform(-8.0, 1.0)); });
    } else {
        std::string known = "none";
        for (const std::string& k : alibi_kinds()) known += ", " + k;
        throw ConfigError("suite case: no ALiBi kind '" + kind + "' (known: " + known + ")");
    }
}

SdpaCase make_case(const CaseConfig& config) {
    if (!config.seed)
        no_recipe(config, "has no seed, so its values are not named by it (a property generator's case: replay its "
                          "case file)");
    if (config.op != "sdpa") no_recipe(config, "no recipe for op " + config.op);
    for (Index n : {config.B, config.H, config.Tq, config.Tk, config.Dk, config.Dv, config.kv_heads})
        if (n < 1) no_recipe(config, "every size must be at least 1");
    if (config.H % config.kv_heads != 0) no_recipe(config, "kv_heads must divide H");
    SdpaCase c;
    c.dtype = config.dtype;
    c.B = config.B, c.H = config.H, c.Tq = config.Tq, c.Tk = config.Tk, c.Dk = config.Dk, c.Dv = config.Dv;
    c.kv_heads = config.kv_heads;
    c.distribution = config.values;
    c.logit_std = config.logit_std;
    c.seed = config.seed;
    c.aux_seed = *config.seed;  // the perturbations of the properties that make their own
    c.mask_kind = config.mask;
    c.options.scale = config.scale;
    c.options.window = config.window;
    c.options.softcap = config.softcap.value_or(0.0);
    c.options.empty_rows = config.empty_rows;
    c.options.check_finite = config.check_finite;
    c.options.num_threads = config.threads;
    Rng rng(*config.seed);
    draw_values(c, rng);
    draw_mask(c, config, rng);
    draw_bias(c, config.bias, rng);
    draw_alibi(c, config.alibi, rng);
    return c;
}

}  // namespace attn::suite
