// The oracle's self-check sweep: every correct implementation of the registry, run on random and adversarial
// cases, stays within the bound of its error model, and the bound is not vacuous (some case comes within 1% of it).
#include <catch2/catch.hpp>

#include <iostream>

#include "attn/report/oracle_sweep.hpp"
#include "attn/suite/config.hpp"
#include "attn/suite/registry.hpp"

using namespace attn;

TEMPLATE_TEST_CASE("no implementation violates its bound over a short sweep, and the bound is not vacuous",
                   "[oracle][sweep]", float, double) {
    using T = TestType;
    for (const suite::Implementation* impl : suite::correct_implementations()) {
        if (impl->dtype_unsupported.count(suite::dtype_of<T>())) continue;  // no path in T (a 16-bit test kernel)
        report::SweepOptions options;
        options.impl = impl->name;
        options.cases = 60;  // a few seconds; the slow test and `attn oracle-sweep` run longer sweeps
        const report::SweepStats st = report::oracle_sweep<T>(options);
        std::cout << impl->name << " sweep " << st.summary() << "\n  worst: " << st.worst_summary << "\n";
        INFO(impl->name << ": " << st.summary());
        INFO(st.first_violation);
        CHECK(st.violations == 0);
        CHECK(st.cases >= 50);
        CHECK(st.worst_tightness >= 1e-2);  // a bound 100x too loose would fail here
        CHECK(st.max_oracle_error_ratio <= oracle::max_oracle_error_ratio);
        INFO(st.first_unbounded);
        CHECK(st.unexplained_unbounded == 0);
        INFO(st.first_suspicious);
        CHECK(st.suspicious == 0);  // the statistical verdict never fires on a correct implementation
        CHECK(suite::parse_config(st.worst_case).to_config() == st.worst_case);  // its name round-trips
    }
}

TEST_CASE("a sweep names its cases by config strings, and a broken implementation fails it") {
    report::SweepOptions options;
    options.impl = "no_scale";
    options.cases = 30;
    const report::SweepStats st = report::oracle_sweep<double>(options);
    CHECK(st.violations > 0);
    CHECK(st.first_violation.rfind("sdpa(B=", 0) == 0);
    CHECK(st.first_violation.find(",impl=no_scale)") != std::string::npos);
}

TEST_CASE("an infinite bound counts as explained only where the row's logits are too inaccurate to bound it") {
    // Accurate logits (Dk = 4, entries ~1): the model bounds every row, so an infinite bound planted in one row's
    // weights is unexplained.
    const Index Tk = 8;
    std::vector<float> q(2 * 4), k(Tk * 4), v(Tk);
    for (std::size_t e = 0; e < q.size(); ++e) q[e] = static_cast<float>(0.25 * static_cast<double>(e % 5) - 0.5);
    for (std::size_t e = 0; e < k.size(); ++e) k[e] = static_cast<float>(0.125 * static_cast<double>(e % 7) - 0.4);
    for (std::size_t e = 0; e < v.size(); ++e) v[e] = static_cast<float>(e);
    const TensorView<const float> qv(q.data(), {1, 2, 4}), kv(k.data(), {1, Tk, 4}), vv(v.data(), {1, Tk, 1});
    oracle::Result<float> r = oracle::scaled_dot_product_attention<float>(qv, kv, vv, std::nullopt, {});
    CHECK_FALSE(report::has_unexplained_unbounded_row<float>(qv, kv, {}, r));  // no infinite bound at all
    r.weights_bound[Tk + 3] = std::numeric_limits<double>::infinity();         // row 1, key 3
    CHECK(report::has_unexplained_unbounded_row<float>(qv, kv, {}, r));

    // Dk = 1024 in float with two keys tied for a logit near 5e4: the dot products' rounding allowance is several
    // nats, the split of the weight between the two is not decided by float logits, and the model rightly gives up.
    const Index Dk = 1024, T2 = 16;
    std::vector<float> q2(Dk), k2(T2 * Dk), v2(T2);
    std::uint64_t state = 12345;
    const auto next = [&state] {  // a small LCG: values spread in [-1, 1)
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return static_cast<double>(state >> 11) * 0x1p-52 - 1;
    };
    for (float& e : q2) e = static_cast<float>(72 * next());
    for (float& e : k2) e = static_cast<float>(72 * next());
    for (float& e : v2) e = static_cast<float>(next());
    for (Index d = 0; d < Dk; ++d) k2[d] = k2[Dk + d] = q2[d];  // keys 0 and 1 tie for the max logit, ~5e4
    const TensorView<const float> q2v(q2.data(), {1, 1, Dk}), k2v(k2.data(), {1, T2, Dk}), v2v(v2.data(), {1, T2, 1});
    const oracle::Result<float> r2 = oracle::scaled_dot_product_attention<float>(q2v, k2v, v2v, std::nullopt, {});
    bool any_inf = false;
    for (Index e = 0; e < r2.weights_bound.numel(); ++e) any_inf = any_inf || std::isinf(r2.weights_bound[e]);
    CHECK(any_inf);
    CHECK_FALSE(report::has_unexplained_unbounded_row<float>(q2v, k2v, {}, r2));
}

TEMPLATE_TEST_CASE("no correct implementation is called suspicious on data whose running sums stagnate",
                   "[oracle][sweep][statistical]", float, double) {
    // Attention sinks, one-hot-ish rows, values in [1, 2), bfloat16 and small-integer data, Tk up to 16384 (oracle/
    // BOUNDS.md section 10, "Stagnation"), under each implementation's own model and under generic; `attn
    // oracle-sweep --classes stagnation` runs the long version.
    using T = TestType;
    for (const suite::Implementation* impl : suite::correct_implementations()) {
        if (!impl->bias_unsupported.empty()) continue;  // the sinks are a bias
        if (impl->dtype_unsupported.count(suite::dtype_of<T>())) continue;
        for (const bool generic : {false, true}) {
            report::SweepOptions options;
            options.impl = impl->name;
            options.classes = "stagnation";
            options.generic_model = generic;
            options.cases = 25;
            const report::SweepStats st = report::oracle_sweep<T>(options);
            std::cout << impl->name << (generic ? " (generic)" : "") << " stagnation sweep " << st.summary() << "\n";
            INFO(impl->name << (generic ? " under generic: " : ": ") << st.summary());
            INFO(st.first_violation);
            CHECK(st.violations == 0);
            CHECK(st.cases >= 20);
            INFO(st.first_suspicious);
            CHECK(st.suspicious == 0);
        }
    }
}
