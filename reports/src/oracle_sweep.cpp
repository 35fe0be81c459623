// The oracle's self-check sweep (see attn/report/oracle_sweep.hpp): shapes and values weighted towards the hard cases.
#include "attn/report/oracle_sweep.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "attn/oracle/oracle.hpp"
#include "attn/suite/config.hpp"
#include "attn/suite/registry.hpp"

namespace attn::report {

using namespace attn::oracle;

std::string SweepStats::summary() const {
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "%s: %lld cases (%lld skipped), %lld over the bound, output tightness worst %.3g median %.3g, "
                  "weights tightness worst %.3g median %.3g, unbounded elements %lld (%lld cases unexplained), "
                  "oracle self-error <= %.2g of "
                  "the bound, %lld rows redone in MPFR; statistical verdict: %lld cases suspicious, worst error/bound %.3g, worst row "
                  "statistic %.3g of its threshold, %lld structured rows; worst case %s",
                  dtype.c_str(), static_cast<long long>(cases), static_cast<long long>(skipped),
                  static_cast<long long>(violations), worst_tightness, median_tightness, worst_weights_tightness,
                  median_weights_tightness, static_cast<long long>(unbounded_elements),
                  static_cast<long long>(unexplained_unbounded), max_oracle_error_ratio,
                  static_cast<long long>(rows_redone_in_mpfr), static_cast<long long>(suspicious), worst_stat_tightness,
                  worst_row_statistic, static_cast<long long>(structured_rows), worst_case.c_str());
    return buf;
}

namespace {

// The sweep's RNG: small, seeded, and the same sequence on every run with the same standard library.
using Rng = std::mt19937_64;

Index pick(Rng& rng, Index lo, Index hi) { return std::uniform_int_distribution<Index>(lo, hi)(rng); }
double uniform(Rng& rng, double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }

struct Case {
    Index B = 1, Tq = 1, Tk = 1, Dk = 1, Dv = 1;
    std::string values, masking;
    SdpaOptions options;
};

// value kinds: every tensor entry of q, k, v is drawn by one of these.
enum class Values { Normal, Integers, LargeLogits, NearTies, WideV, WideAll };

template <class T>
void fill(Rng& rng, std::vector<T>& x, Values kind, double magnitude) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (T& e : x) {
        switch (kind) {
            case Values::Integers: e = static_cast<T>(pick(rng, -3, 3)); break;
            case Values::WideAll: {
                // |e| in 10^[-15, 15] so logits stay finite in float; v is filled separately.
                const double sign = pick(rng, 0, 1) ? 1.0 : -1.0;
                e = static_cast<T>(sign * std::pow(10.0, uniform(rng, -15, 15)));
                break;
            }
            default: e = static_cast<T>(magnitude * normal(rng)); break;
        }
    }
}

template <class T>
Case make_case(Rng& rng, bool adversarial, std::vector<T>& q, std::vector<T>& k, std::vector<T>& v,
               std::vector<char>& allowed, bool& has_mask) {
    Case c;
    const Index shape_kind = pick(rng, 0, 99);
    if (shape_kind < 45 || !adversarial) {  // small: where rounding errors are few and the bound is tightest
        c.B = pick(rng, 1, 2), c.Tq = pick(rng, 1, 6), c.Tk = pick(rng, 1, 6), c.Dk = pick(rng, 1, 8), c.Dv = pick(rng, 1, 4);
    } else if (shape_kind < 75) {
        c.Tq = pick(rng, 1, 32), c.Tk = pick(rng, 1, 64), c.Dk = pick(rng, 1, 64), c.Dv = pick(rng, 1, 16);
    } else if (shape_kind < 87) {  // long rows
        c.Tq = pick(rng, 1, 2), c.Tk = pick(rng, 512, 4096), c.Dk = pick(rng, 1, 32), c.Dv = pick(rng, 1, 3);
    } else if (shape_kind < 97) {  // deep dot products
        c.Tq = pick(rng, 1, 3), c.Tk = pick(rng, 1, 48), c.Dk = pick(rng, 256, 1024), c.Dv = pick(rng, 1, 3);
    } else {  // both at once
        c.Tq = 1, c.Tk = 4096, c.Dk = 1024, c.Dv = 1;
    }
    Values kind = Values::Normal;
    double magnitude = 1.0;
    const Index value_kind = adversarial ? pick(rng, 0, 9) : 0;
    switch (value_kind) {
        case 0: case 1: case 2: kind = Values::Normal; c.values = "normal"; break;
        case 3: kind = Values::Integers; c.values = "integers"; break;
        case 4: case 5: {
            // q and k of size m: logits ~ m^2 sqrt(Dk) / sqrt(Dk) = m^2, up to 1e4.
            kind = Values::LargeLogits;
            const double logit = std::pow(10.0, uniform(rng, 0, 4));
            magnitude = std::sqrt(logit);
            char buf[48];
            std::snprintf(buf, sizeof buf, "logits~%.3g", logit);
            c.values = buf;
            break;
        }
        case 6: case 7: kind = Values::NearTies; c.values = "near-ties"; break;
        case 8: kind = Values::WideV; c.values = "v-1e-30..1e30"; break;
        default: kind = Values::WideAll; c.values = "all-wide"; break;
    }
    q.resize(static_cast<std::size_t>(c.B * c.Tq * c.Dk));
    k.resize(static_cast<std::size_t>(c.B * c.Tk * c.Dk));
    v.resize(static_cast<std::size_t>(c.B * c.Tk * c.Dv));
    fill(rng, q, kind, magnitude);
    fill(rng, k, kind, magnitude);
    fill(rng, v, kind == Values::WideAll ? Values::Normal : kind, 1.0);
    if (kind == Values::NearTies) {
        // Every key row is the first one plus a relative perturbation of 2^-20 .. 2^-50: logits tie to a few ulps.
        const double rel = std::ldexp(1.0, -static_cast<int>(pick(rng, 20, 50)));
        std::normal_distribution<double> normal(0.0, 1.0);
        for (Index b = 0; b < c.B; ++b)
            for (Index j = 1; j < c.Tk; ++j)
                for (Index d = 0; d < c.Dk; ++d) {
                    const double k0 = static_cast<double>(k[(b * c.Tk) * c.Dk + d]);
                    k[(b * c.Tk + j) * c.Dk + d] = static_cast<T>(k0 * (1 + rel * normal(rng)));
                }
    }
    if (kind == Values::WideV || kind == Values::WideAll) {
        for (T& e : v) {
            const double sign = pick(rng, 0, 1) ? 1.0 : -1.0;
            e = static_cast<T>(sign * std::pow(10.0, uniform(rng, -30, 30)));
        }
    }
    // Masks: none, causal (both alignments), or random with empty rows allowed (EmptyRowPolicy::Zero).
    has_mask = false;
    const Index mask_kind = pick(rng, 0, 9);
    c.masking = "none";
    if (mask_kind == 7 || mask_kind == 8) {
        c.options.is_causal = true;
        c.options.alignment = mask_kind == 7 ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
        c.options.empty_rows = EmptyRowPolicy::Zero;
        c.masking = mask_kind == 7 ? "causal-tl" : "causal-br";
    } else if (mask_kind == 9) {
        has_mask = true;
        allowed.resize(static_cast<std::size_t>(c.B * c.Tq * c.Tk));
        const double density = uniform(rng, 0.1, 1.0);
        for (char& a : allowed) a = uniform(rng, 0, 1) < density;
        c.options.empty_rows = EmptyRowPolicy::Zero;
        c.masking = "random";
    }
    c.options.return_weights = true;
    return c;
}

// A case of the stagnation classes (SweepOptions::classes): q and k N(0, 1) (or small integers, or rounded to
// bfloat16), v N(0, 1) or in [1, 2); a sink of 10-20 nats on key 0 or one dominant key per row, as a (B, Tq, Tk)
// bias; no mask, or causal in either alignment (key 0 stays visible to every row under both).
template <class T>
Case make_stagnation_case(Rng& rng, std::vector<T>& q, std::vector<T>& k, std::vector<T>& v, std::vector<T>& bias) {
    Case c;
    static constexpr Index lengths[] = {64, 256, 1024, 4096, 16384};
    static constexpr Index depths[] = {16, 32, 64, 128};
    c.Tq = pick(rng, 1, 4), c.Tk = lengths[pick(rng, 0, 4)], c.Dk = depths[pick(rng, 0, 3)], c.Dv = pick(rng, 1, 4);
    if (c.Tk == 16384) c.Tq = 1;  // the oracle's cost grows with Tq Tk (Dk + Dv)
    const Index kind = pick(rng, 0, 4);  // sink, one-hot, [1, 2), bfloat16, integers
    static const char* names[] = {"sink", "one-hot", "v-1..2", "bf16", "integers"};
    std::normal_distribution<double> normal(0.0, 1.0);
    const auto draw = [&](std::vector<T>& x, std::size_t size, bool unit) {
        x.resize(size);
        for (T& e : x) {
            if (kind == 4) e = static_cast<T>(pick(rng, -3, 3));
            else if (unit) e = static_cast<T>(uniform(rng, 1, 2));
            else if (kind == 3) e = static_cast<T>(static_cast<float>(bfloat16(static_cast<float>(normal(rng)))));
            else e = static_cast<T>(normal(rng));
        }
    };
    draw(q, static_cast<std::size_t>(c.Tq * c.Dk), false);
    draw(k, static_cast<std::size_t>(c.Tk * c.Dk), false);
    draw(v, static_cast<std::size_t>(c.Tk * c.Dv), kind == 2);
    // The sink: always for sink and one-hot rows, three times in four for the others.
    const bool sink = kind <= 1 || pick(rng, 0, 3) > 0;
    const double height = uniform(rng, 10, 20);
    bias.assign(static_cast<std::size_t>(c.Tq * c.Tk), T(0));
    if (sink)
        for (Index i = 0; i < c.Tq; ++i) {
            const Index j = kind == 1 ? pick(rng, 0, std::min(i, c.Tk - 1)) : 0;  // visible under either causal rule
            bias[static_cast<std::size_t>(i * c.Tk + j)] = static_cast<T>(height);
        }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s%.3g", names[kind], sink ? "-sink" : "-nosink", sink ? height : 0.0);
    c.values = buf;
    const Index mask_kind = pick(rng, 0, 2);
    c.masking = "none";
    if (mask_kind > 0) {
        c.options.is_causal = true;
        c.options.alignment = mask_kind == 1 ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
        c.masking = mask_kind == 1 ? "causal-tl" : "causal-br";
    }
    c.options.return_weights = true;
    return c;
}

double median(std::vector<double> x) {
    if (x.empty()) return 0;
    std::sort(x.begin(), x.end());
    const std::size_t n = x.size();
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

}  // namespace

// Whether a row with an infinite bound has logits accurate enough that the model should have bounded it: its
// estimated exponent allowance gamma_{Dk+2} |scale| max_j sum_d |q_d k_jd| + u max_j |s_j| (over every key, masked
// or not, so an over-estimate) is below 0.05 nats (SweepStats::unexplained_unbounded says why 0.05). The sweep's
// q and k are contiguous.
template <class T>
bool has_unexplained_unbounded_row(TensorView<const T> q, TensorView<const T> k, const SdpaOptions& options,
                                   const Result<T>& exact) {
    const Index B = q.shape()[0], Tq = q.shape()[1], Dk = q.shape()[2], Tk = k.shape()[1];
    const Index Dv = exact.output.shape()[2];
    const double u = std::ldexp(1.0, -std::numeric_limits<T>::digits);
    const double gamma = (Dk + 2) * u / (1 - (Dk + 2) * u);
    const double scale = std::abs(resolved_scale(options.scale, Dk));
    for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Tq; ++i) {
            bool unbounded = false;
            for (Index c = 0; c < Dv; ++c) unbounded = unbounded || std::isinf(exact.output_bound[(b * Tq + i) * Dv + c]);
            for (Index j = 0; j < Tk; ++j) unbounded = unbounded || std::isinf(exact.weights_bound[(b * Tq + i) * Tk + j]);
            if (!unbounded) continue;
            double allowance = 0;
            for (Index j = 0; j < Tk; ++j) {
                double abs_dot = 0, dot = 0;
                for (Index d = 0; d < Dk; ++d) {
                    const double p = static_cast<double>(q.data()[(b * Tq + i) * Dk + d]) *
                                     static_cast<double>(k.data()[(b * Tk + j) * Dk + d]);
                    abs_dot += std::abs(p);
                    dot += p;
                }
                allowance = std::max(allowance, gamma * scale * abs_dot + u * scale * std::abs(dot));
            }
            if (!(allowance >= 0.05)) return true;
        }
    return false;
}

template <class T>
SweepStats oracle_sweep(const SweepOptions& so) {
    const suite::Implementation& impl = suite::implementation(so.impl);
    SweepStats st;
    st.dtype = std::is_same_v<T, float> ? "float" : "double";
    Rng rng(so.seed + (std::is_same_v<T, float> ? 0 : 1));
    std::vector<double> tight_out, tight_w;
    std::vector<T> q, k, v, bias_values;
    std::vector<char> allowed_chars;
    if (so.classes != "adversarial" && so.classes != "stagnation")
        throw ConfigError("oracle_sweep: classes must be adversarial or stagnation, got '" + so.classes + "'");
    const bool stagnation = so.classes == "stagnation";
    if (stagnation && !impl.bias_unsupported.empty())
        throw ConfigError("oracle_sweep: the stagnation classes put their sinks in a bias, and " + impl.bias_unsupported);
    for (Index n = 0; n < so.cases; ++n) {
        bool has_mask = false;
        Case c = stagnation ? make_stagnation_case<T>(rng, q, k, v, bias_values)
                            : make_case<T>(rng, so.adversarial, q, k, v, allowed_chars, has_mask);
        Tensor<T> bias_tensor;
        if (stagnation) {
            bias_tensor = Tensor<T>({c.B, c.Tq, c.Tk});
            std::copy(bias_values.begin(), bias_values.end(), bias_tensor.data());
            c.options.bias = FloatView(bias_tensor);
        }
        suite::CaseConfig config;
        config.B = c.B, config.H = 1, config.kv_heads = 1, config.Tq = c.Tq, config.Tk = c.Tk, config.Dk = c.Dk,
        config.Dv = c.Dv;
        config.mask = c.masking;
        config.mask_rank = has_mask ? 3 : 0;  // (B, Tq, Tk)
        config.dtype = std::is_same_v<T, float> ? suite::Dtype::Float : suite::Dtype::Double;
        config.values = c.values;
        config.empty_rows = c.options.empty_rows;
        config.impl = impl.name;
        if (stagnation) config.bias = "matrix";  // a (B, Tq, Tk) bias: the sink or the dominant keys
        const std::string cfg = config.to_config();
        const TensorView<const T> qv(q.data(), {c.B, c.Tq, c.Dk}), kv(k.data(), {c.B, c.Tk, c.Dk}),
            vv(v.data(), {c.B, c.Tk, c.Dv});
        Tensor<bool> allowed_mask({c.B, c.Tq, c.Tk});
        for (Index e = 0; e < allowed_mask.numel() && has_mask; ++e) allowed_mask[e] = allowed_chars[static_cast<std::size_t>(e)];
        std::optional<TensorView<const bool>> am;
        if (has_mask) am = allowed_mask.view();
        SdpaResult<T> computed;
        try {
            SdpaOptions run_options = c.options;
            run_options.return_weights = impl.returns_weights;  // the tiled kernel's output alone is compared
            computed = impl.run<T>(qv, kv, vv, am, run_options);
        } catch (const ValueError&) {
            ++st.skipped;  // e.g. a logit or the output overflowed T: documented refusal, nothing to compare
            continue;
        }
        OracleOptions oo;
        oo.model = so.generic_model ? generic_model() : impl.error_model;
        oo.statistical = so.statistical;
        const Result<T> exact = scaled_dot_product_attention<T>(qv, kv, vv, am, c.options, oo);
        st.rows_redone_in_mpfr += exact.rows_redone_in_mpfr;
        if (so.compare_mpfr) {
            OracleOptions all_mpfr = oo;
            all_mpfr.bits = 114;
            const Result<T> slow = scaled_dot_product_attention<T>(qv, kv, vv, am, c.options, all_mpfr);
            all_mpfr.statistical = false;  // only its rounded results are compared
            const auto same = [](const Tensor<T>& a, const Tensor<T>& b) {
                return a.numel() == b.numel() &&
                       std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
            };
            if (!same(exact.output, slow.output) || !same(exact.weights, slow.weights)) {
                if (st.mpfr_mismatches == 0) st.first_mpfr_mismatch = cfg;
                ++st.mpfr_mismatches;
            }
        }
        const Comparison out = compare_output<T>(computed.output.view(), exact);
        const bool has_weights = computed.weights.has_value();
        const Comparison w = has_weights ? compare_weights<T>(computed.weights->view(), exact) : Comparison{};
        ++st.cases;
        tight_out.push_back(out.max_tightness);
        if (has_weights) tight_w.push_back(w.max_tightness);
        st.unbounded_elements += out.unbounded + w.unbounded;
        if (out.unbounded + w.unbounded > 0) {
            const bool unexplained = has_unexplained_unbounded_row<T>(qv, kv, c.options, exact);
            // The first unexplained case is the one to look at: there the model should have bounded it.
            if (st.first_unbounded.empty() || (unexplained && st.unexplained_unbounded == 0))
                st.first_unbounded = "case " + std::to_string(n) + " " + cfg + ": output " + out.summary() +
                                     (has_weights ? "; weights " + w.summary() : "");
            if (unexplained) ++st.unexplained_unbounded;
        }
        st.max_oracle_error_ratio = std::max(st.max_oracle_error_ratio, exact.oracle_error_ratio);
        if (so.statistical) {
            const Comparison so_out = compare_output_statistical<T>(computed.output.view(), exact);
            const Comparison so_w = has_weights ? compare_weights_statistical<T>(computed.weights->view(), exact) : Comparison{};
            const RowStatistic rs = row_statistic<T>(computed.output.view(), exact);
            st.structured_rows += exact.structured_rows;
            st.worst_stat_tightness = std::max({st.worst_stat_tightness, so_out.max_tightness, so_w.max_tightness});
            if (rs.threshold > 0) st.worst_row_statistic = std::max(st.worst_row_statistic, rs.sum_squares / rs.threshold);
            if (!so_out.pass() || !so_w.pass() || rs.suspicious()) {
                if (st.suspicious == 0)
                    st.first_suspicious = cfg + ": output " + so_out.summary() +
                                          (has_weights ? "; weights " + so_w.summary() : "") + "; row statistic " +
                                          std::to_string(rs.sum_squares) + " of threshold " + std::to_string(rs.threshold);
                ++st.suspicious;
            }
        }
        if (!out.pass() || !w.pass()) {
            if (st.violations == 0)
                st.first_violation = cfg + ": output " + out.summary() + (has_weights ? "; weights " + w.summary() : "");
            ++st.violations;
        }
        if (out.max_tightness >= st.worst_tightness) {
            st.worst_tightness = out.max_tightness;
            st.worst_case = cfg;
            st.worst_summary = out.summary();
        }
        st.worst_weights_tightness = std::max(st.worst_weights_tightness, w.max_tightness);
    }
    st.median_tightness = median(tight_out);
    st.median_weights_tightness = median(tight_w);
    return st;
}

template SweepStats oracle_sweep<float>(const SweepOptions&);
template SweepStats oracle_sweep<double>(const SweepOptions&);
template bool has_unexplained_unbounded_row<float>(TensorView<const float>, TensorView<const float>, const SdpaOptions&,
                                                   const Result<float>&);
template bool has_unexplained_unbounded_row<double>(TensorView<const double>, TensorView<const double>,
                                                    const SdpaOptions&, const Result<double>&);

}  // namespace attn::report
