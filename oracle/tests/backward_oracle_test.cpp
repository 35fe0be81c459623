// The oracle's exact gradients checked against its own forward: central finite differences of L = sum(dout * O),
// computed in the same 261-bit arithmetic, agree with every gradient element on random cases with every variant; and
// the forward those differences run on is the SDPA oracle's (its output correctly rounded, bit for bit).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "attn/oracle/backward.hpp"
#include "attn/oracle/oracle.hpp"
#include "backward_engine.hpp"

using namespace attn;
using oracle::detail::ExactHead;
using oracle::detail::Mp;

namespace {

struct Case {
    const char* name;
    Index Tq, Tk;
    SdpaOptions options;
    bool mask = false, bias = false, alibi = false;
    bool dropout = false;  // weight multipliers 0 or 1/(1-p) (section 12c), p = 0.3
};

std::vector<Case> cases() {
    std::vector<Case> all;
    all.push_back({"plain", 5, 7, {}});
    Case causal{"causal bottom-right, Tq > Tk", 7, 5, {}};
    causal.options.is_causal = true;
    causal.options.alignment = CausalAlignment::BottomRight;
    causal.options.empty_rows = EmptyRowPolicy::Zero;  // rows 0 and 1 see no key
    all.push_back(causal);
    Case masked{"mask, bias and ALiBi", 6, 6, {}};
    masked.mask = masked.bias = masked.alibi = true;
    masked.options.empty_rows = EmptyRowPolicy::Zero;
    all.push_back(masked);
    Case capped{"soft-capped at 1.5, window (2, 1)", 6, 8, {}};
    capped.options.softcap = 1.5;
    capped.options.window = SlidingWindow{2, 1};
    capped.bias = true;
    all.push_back(capped);
    Case dropped{"dropout multipliers (0 or 1/0.7) with a mask and a cap", 6, 7, {}};
    dropped.mask = dropped.dropout = true;
    dropped.options.softcap = 2.0;
    dropped.options.empty_rows = EmptyRowPolicy::Zero;
    all.push_back(dropped);
    return all;
}

// sum over the rows and columns of dout * O, exactly.
Mp loss(const ExactHead& h) {
    const std::vector<Mp> out = oracle::detail::exact_output(h);
    Mp l = 0;
    for (std::size_t x = 0; x < out.size(); ++x) l += h.dout[x] * out[x];
    return l;
}

}  // namespace

TEST_CASE("central differences of the exact forward agree with the exact gradients", "[oracle][backward]") {
    std::mt19937_64 rng(20261204);
    std::normal_distribution<double> normal(0.0, 1.0);
    const Index Dk = 4, Dv = 3;
    for (const Case& c : cases()) {
        INFO(c.name);
        Tensor<double> q({1, c.Tq, Dk}), k({1, c.Tk, Dk}), v({1, c.Tk, Dv}), dout({1, c.Tq, Dv}), bias({c.Tq, c.Tk});
        for (auto* t : {&q, &k, &v, &dout, &bias})
            for (Index x = 0; x < t->numel(); ++x) (*t)[x] = normal(rng);
        Tensor<bool> mask({c.Tq, c.Tk});
        for (Index x = 0; x < mask.numel(); ++x) mask[x] = (x * 7) % 5 != 0;
        const Tensor<double> slopes = Tensor<double>::copy_of(TensorView<const double>(std::vector<double>{0.25}.data(), {1}));
        SdpaOptions options = c.options;
        if (c.bias) options.bias = bias;
        if (c.alibi) options.alibi_slopes = slopes;
        const std::optional<TensorView<const bool>> m =
            c.mask ? std::optional<TensorView<const bool>>(mask.view()) : std::nullopt;

        const SdpaProblem<double> p = make_sdpa_problem<double>("test", q.view(), k.view(), v.view(), m, options);
        const std::vector<Readability> r = check_contracts(p, options);
        const detail::SavedRows<double> rows("test", "dout", dout.view(), p.output_shape(), p.batch_shape, "");
        ExactHead h = oracle::detail::exact_head(p, r[0], 0, rows);
        if (c.dropout) {
            h.mult.assign(static_cast<std::size_t>(c.Tq * c.Tk), Mp(0));
            for (Mp& x : h.mult) x = rng() % 10 < 3 ? Mp(0) : Mp(1.0 / 0.7);
        }
        const oracle::detail::ExactGradients g = oracle::detail::exact_gradients(h);

        // Central differences with step 2^-40: their truncation error is h^2 / 6 |L'''| < 2^-82 |L'''|, and L''' of
        // these O(1) inputs is O(1)-O(100); the rounding error of 261-bit sums divided by 2h is near 2^-220. So the
        // two must agree to far better than 1e-18 (a wrong term of the gradient is off by O(0.01) or more).
        const Mp step = Mp(std::ldexp(1.0, -40));
        double worst = 0;
        const auto check = [&](std::vector<Mp> ExactHead::*member, const std::vector<Mp>& grad) {
            for (std::size_t x = 0; x < grad.size(); ++x) {
                ExactHead plus = h, minus = h;
                (plus.*member)[x] += step;
                (minus.*member)[x] -= step;
                const Mp fd = (loss(plus) - loss(minus)) / (2 * step);
                worst = std::max(worst, static_cast<double>(abs(fd - grad[x])));
            }
        };
        // Only the rows and keys the problem reads are in the head: the others are 0 with gradient 0.
        check(&ExactHead::q, g.dq);
        check(&ExactHead::k, g.dk);
        check(&ExactHead::v, g.dv);
        CHECK(worst < 1e-18);
        // A gradient that is 0 everywhere would pass the differences trivially only if L were constant: it is not.
        double largest = 0;
        for (const auto* grad : {&g.dq, &g.dk, &g.dv})
            for (const Mp& x : *grad) largest = std::max(largest, static_cast<double>(abs(x)));
        CHECK(largest > 1e-3);

        // The forward the differences ran on is the SDPA oracle's: the same output, correctly rounded.
        if (c.dropout) continue;  // the SDPA oracle has no multipliers
        const oracle::Result<double> fwd = oracle::scaled_dot_product_attention<double>(q.view(), k.view(), v.view(), m, options);
        const std::vector<Mp> out = oracle::detail::exact_output(h);
        for (Index i = 0; i < c.Tq; ++i) {
            if (!r[0].row_nonempty[static_cast<std::size_t>(i)]) continue;
            for (Index d = 0; d < Dv; ++d) CHECK(out[static_cast<std::size_t>(i * Dv + d)].convert_to<double>() == fwd.output[i * Dv + d]);
        }
    }
}

TEST_CASE("the oracle's gradients: keys nobody reads get zero, broadcast inputs get the sum, bad dout is refused",
          "[oracle][backward]") {
    std::mt19937_64 rng(7);
    std::normal_distribution<double> normal(0.0, 1.0);
    // k and v shared by 3 query heads (grouped-query attention), causal, so the last key is read by the last query
    // only; a mask that blocks key 4 for every query.
    Tensor<double> q({2, 3, 5, 4}), k({2, 1, 5, 4}), v({2, 1, 5, 2}), dout({2, 3, 5, 2});
    for (auto* t : {&q, &k, &v, &dout})
        for (Index x = 0; x < t->numel(); ++x) (*t)[x] = normal(rng);
    Tensor<bool> mask({5, 5});
    for (Index i = 0; i < 5; ++i)
        for (Index j = 0; j < 5; ++j) mask[i * 5 + j] = j != 4;
    SdpaOptions options;
    options.is_causal = true;
    const oracle::Gradients<double> g = oracle::sdpa_backward<double>(q.view(), k.view(), v.view(), dout.view(), mask.view(), options);
    REQUIRE(g.dk.shape() == k.shape());
    REQUIRE(g.dv.shape() == v.shape());
    for (Index b = 0; b < 2; ++b)
        for (Index d = 0; d < 4; ++d) CHECK(g.dk[(b * 5 + 4) * 4 + d] == 0.0);
    // The grouped gradient is the sum of the per-head gradients of k expanded to 3 heads.
    Tensor<double> k3({2, 3, 5, 4}), v3({2, 3, 5, 2});
    for (Index b = 0; b < 2; ++b)
        for (Index h = 0; h < 3; ++h) {
            std::copy_n(k.data() + b * 20, 20, k3.data() + (b * 3 + h) * 20);
            std::copy_n(v.data() + b * 10, 10, v3.data() + (b * 3 + h) * 10);
        }
    const oracle::Gradients<double> e = oracle::sdpa_backward<double>(q.view(), k3.view(), v3.view(), dout.view(), mask.view(), options);
    for (Index b = 0; b < 2; ++b)
        for (Index x = 0; x < 20; ++x) {
            long double sum = 0;
            for (Index h = 0; h < 3; ++h) sum += e.dk_exact[(b * 3 + h) * 20 + x];
            CHECK(std::abs(static_cast<double>(sum - g.dk_exact[b * 20 + x])) <= 1e-15 * (1 + std::abs(static_cast<double>(sum))));
        }
    CHECK(g.dq.shape() == q.shape());
    const Tensor<double> wrong({2, 3, 5, 3});
    CHECK_THROWS_AS(oracle::sdpa_backward<double>(q.view(), k.view(), v.view(), wrong.view(), mask.view(), options), ShapeError);
    dout[0] = std::nan("");
    CHECK_THROWS_AS(oracle::sdpa_backward<double>(q.view(), k.view(), v.view(), dout.view(), mask.view(), options), ValueError);
}
