// Backend `tiled` against the oracle: every output element within the bound of the tiled error model (built from
// attn/tiled.hpp), with the tightness printed next to `reference`'s under its own model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <sstream>
#include <vector>

#include "attn/attn.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#include "attn/tiled.hpp"
#include "oracle_check.hpp"

using namespace attn;

namespace {

// One documented place for the number of cases (the oracle dominates the run time).
constexpr int oracle_cases = 24;

template <class T>
void run_cases(std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    const auto uniform = [&](Index lo, Index hi) { return std::uniform_int_distribution<Index>(lo, hi)(gen); };
    std::normal_distribution<double> normal(0.0, 1.0);
    const std::vector<Index> T_edges{1, 2, 127, 129, 255, 257, 300};
    double worst_tiled = 0, worst_reference = 0;
    for (int n = 0; n < oracle_cases; ++n) {
        const Index B = uniform(1, 2), Tq = T_edges[uniform(0, 6)], Tk = T_edges[uniform(0, 6)];
        const Index Dk = std::vector<Index>{1, 7, 16, 64}[uniform(0, 3)];
        const Index Dv = std::vector<Index>{1, 5, 16}[uniform(0, 2)];
        // Logit scale: ordinary (1), large (near-one-hot rows, big max subtraction) or tiny (near-ties).
        const double value_scale = std::vector<double>{1.0, 6.0, 1e-3}[uniform(0, 2)];
        Tensor<T> q({B, Tq, Dk}), k({B, Tk, Dk}), v({B, Tk, Dv});
        for (Index i = 0; i < q.numel(); ++i) q[i] = static_cast<T>(value_scale * normal(gen));
        for (Index i = 0; i < k.numel(); ++i) k[i] = static_cast<T>(value_scale * normal(gen));
        for (Index i = 0; i < v.numel(); ++i) v[i] = static_cast<T>(normal(gen));
        SdpaOptions options;
        options.empty_rows = EmptyRowPolicy::Zero;
        const int masking = static_cast<int>(uniform(0, 3));
        options.is_causal = masking == 1 || masking == 2;
        options.alignment = masking == 1 ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
        std::optional<Tensor<bool>> allowed;
        if (masking == 3) {
            allowed = Tensor<bool>({B, Tq, Tk});
            for (Index i = 0; i < allowed->numel(); ++i) (*allowed)[i] = uniform(0, 9) < 7;
        }
        std::optional<TensorView<const bool>> am;
        if (allowed) am = allowed->view();
        std::ostringstream cfg;
        cfg << "sdpa(B=" << B << ",Tq=" << Tq << ",Tk=" << Tk << ",Dk=" << Dk << ",Dv=" << Dv
            << ",values=x" << value_scale << ",mask="
            << (masking == 0 ? "none" : masking == 1 ? "causal-tl" : masking == 2 ? "causal-br" : "random")
            << ",dtype=" << (sizeof(T) == 4 ? "float" : "double") << ")";
        INFO(cfg.str());

        oracle::OracleOptions oo;
        oo.model = oracle::library_tiled_model();
        const oracle::Result<T> exact_tiled = oracle::scaled_dot_product_attention<T>(q, k, v, am, options, oo);
        oo.model = oracle::reference_model();
        const oracle::Result<T> exact_reference = oracle::scaled_dot_product_attention<T>(q, k, v, am, options, oo);

        options.backend = Backend::Tiled;
        const auto tiled = scaled_dot_product_attention(q.view(), k.view(), v.view(), am, options);
        options.backend = Backend::Reference;
        const auto reference = scaled_dot_product_attention(q.view(), k.view(), v.view(), am, options);

        const oracle::Comparison ct = oracle::compare_output<T>(tiled.output.view(), exact_tiled);
        const oracle::Comparison cr = oracle::compare_output<T>(reference.output.view(), exact_reference);
        INFO("tiled: " << ct.summary());
        CHECK(ct.pass());
        CHECK(ct.unbounded == 0);
        worst_tiled = std::max(worst_tiled, ct.max_tightness);
        worst_reference = std::max(worst_reference, cr.max_tightness);
    }
    std::cout << (sizeof(T) == 4 ? "float" : "double") << ": worst error/bound tiled " << worst_tiled
              << " (tiled model), reference " << worst_reference << " (reference model)\n";
}

}  // namespace

TEMPLATE_TEST_CASE("tiled is within the oracle's bound under the tiled error model", "[tiled][oracle]", float,
                   double) {
    run_cases<TestType>(sizeof(TestType) == 4 ? 8101 : 8102);
}

TEMPLATE_TEST_CASE("with a softcap, both backends are within the oracle's bound of their models, near saturation too",
                   "[tiled][oracle][softcap]", float, double) {
    using T = TestType;
    std::mt19937_64 gen(sizeof(T) == 4 ? 8103 : 8104);
    std::normal_distribution<double> normal(0.0, 1.0);
    double worst[2] = {0, 0};
    // Caps far below the logits (every row saturated: the logits all near +-c), near them, and far above them.
    for (const double cap : {0.05, 0.7, 4.0, 30.0, 1e4})
        for (const double value_scale : {1.0, 6.0}) {
            const Index Tq = 129, Tk = 300, Dk = 16, Dv = 5;
            Tensor<T> q({2, Tq, Dk}), k({2, Tk, Dk}), v({2, Tk, Dv});
            for (Index i = 0; i < q.numel(); ++i) q[i] = static_cast<T>(value_scale * normal(gen));
            for (Index i = 0; i < k.numel(); ++i) k[i] = static_cast<T>(value_scale * normal(gen));
            for (Index i = 0; i < v.numel(); ++i) v[i] = static_cast<T>(normal(gen));
            SdpaOptions options;
            options.softcap = static_cast<double>(static_cast<T>(cap));
            options.is_causal = value_scale > 1;
            options.alignment = CausalAlignment::BottomRight;
            options.tiled_key_block = 64;  // several rescalings per row
            INFO("softcap " << cap << ", values x" << value_scale);
            const auto tightness = test::backends_within_oracle_bounds<T>(q, k, v, std::nullopt, options);
            for (int b = 0; b < 2; ++b) worst[b] = std::max(worst[b], tightness[std::size_t(b)]);
        }
    std::cout << (sizeof(T) == 4 ? "float" : "double") << " with softcap: worst error/bound tiled " << worst[0]
              << ", reference " << worst[1] << "\n";
}

TEMPLATE_TEST_CASE("std::tanh, the reference backend's soft-capping tanh, is within the reference model's tanh_ulps",
                   "[oracle][softcap]", float, double) {
    using T = TestType;
    // [0, 20] densely and tiny arguments down to the subnormal range (tanh is odd; glibc reflects the sign).
    const double limit = oracle::reference_model().tanh_ulps;
    double worst = 0, worst_x = 0;
    const auto check = [&](T x) {
        const double d = oracle::ulp_distance<T>(std::tanh(x), std::tanh(static_cast<long double>(x)));
        if (d > worst) worst = d, worst_x = x;
    };
    const Index n = 1 << 19;
    for (Index i = 0; i < n; ++i) check(static_cast<T>(20.0 * double(i) / double(n - 1)));
    for (double e = -140; e < 0; e += 0.01) check(static_cast<T>(std::exp2(e)));
    std::cout << "std::tanh " << (sizeof(T) == 4 ? "float" : "double") << ": max ulp distance " << worst << " at x = "
              << worst_x << " (limit " << limit << ")\n";
    CHECK(worst <= limit);
}
