// make_sdpa_problem, readability and check_contracts: the validation every backend and the oracle share.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "attn/detail/mha_problem.hpp"
#include "error_message.hpp"

using namespace attn;
using Catch::Contains;

TEST_CASE("make_sdpa_problem resolves the broadcast batch shape, sizes and default scale", "[problem]") {
    const Tensor<float> q({2, 1, 3, 4}), k({3, 5, 4}), v({1, 5, 6});
    const auto p = make_sdpa_problem<float>("sdpa", q.view(), k.view(), v.view(), std::nullopt, {});
    CHECK(p.batch_shape == Shape{2, 3});
    CHECK(p.batch == 6);
    CHECK(p.Tq == 3);
    CHECK(p.Tk == 5);
    CHECK(p.Dk == 4);
    CHECK(p.Dv == 6);
    CHECK(p.scale == 0.5);
    CHECK(p.output_shape() == Shape{2, 3, 3, 6});
    CHECK(p.weights_shape() == Shape{2, 3, 3, 5});
    CHECK(p.batch_index_string(4) == "[1,1]");
    CHECK(p.shapes == "q [2,1,3,4], k [3,5,4], v [1,5,6]");
    // Batch element [1,2] reads q[1,0], k[2] and v[0].
    CHECK(p.q_row(5, 0) == q.data() + 12);
    CHECK(p.k_row(5, 1) == k.data() + 2 * 20 + 4);
    CHECK(p.v_row(5, 0) == v.data());
}

TEST_CASE("readability marks the keys some query reads and the rows with no allowed key", "[problem]") {
    const Tensor<double> q({4, 2}), k({3, 2}), v({3, 1});
    SdpaOptions options;
    options.is_causal = true;
    options.alignment = CausalAlignment::BottomRight;  // Tq=4 > Tk=3: row 0 is empty, row i reads keys 0..i-1
    const auto p = make_sdpa_problem<double>("sdpa", q.view(), k.view(), v.view(), std::nullopt, options);
    const Readability r = readability(p, 0);
    CHECK(r.first_empty_row == 0);
    CHECK(r.row_nonempty == std::vector<char>{0, 1, 1, 1});
    CHECK(r.key_readable == std::vector<char>{1, 1, 1});
    // With an explicit mask that never allows key 1, key 1 is unreadable.
    const Tensor<bool> allowed({3}, {true, false, true});
    options.is_causal = false;
    const auto pm = make_sdpa_problem<double>("sdpa", q.view(), k.view(), v.view(), allowed.view(), options);
    const Readability rm = readability(pm, 0);
    CHECK(rm.first_empty_row == -1);
    CHECK(rm.key_readable == std::vector<char>{1, 0, 1});
    CHECK_FALSE(pm.allowed(0, 2, 1));
    CHECK(pm.allowed(0, 2, 2));
}

TEST_CASE("check_contracts looks for NaN/Inf only where some query reads", "[problem]") {
    Tensor<float> q({2, 2}, {1, 2, 3, 4}), k({3, 2}), v({3, 1});
    const Tensor<bool> allowed({3}, {true, true, false});
    k({2, 0}) = std::numeric_limits<float>::quiet_NaN();  // key 2 is never read
    v({2, 0}) = std::numeric_limits<float>::infinity();
    const auto p = make_sdpa_problem<float>("sdpa", q.view(), k.view(), v.view(), allowed.view(), {});
    CHECK(check_contracts(p, {}).size() == 1);
    v({1, 0}) = std::numeric_limits<float>::infinity();  // key 1 is read
    const std::string m = test::error_message<ValueError>([&] { check_contracts(p, {}); });
    CHECK_THAT(m, Contains("sdpa") && Contains("v [3,1]") && Contains("row 1") && Contains("inf"));
    SdpaOptions unchecked;
    unchecked.check_finite = false;
    CHECK_NOTHROW(check_contracts(p, unchecked));
}

TEST_CASE("head_readability per (batch, head) is the readability of the same SDPA problem", "[problem]") {
    // allowed (2, 1, 4, 5) broadcast over H = 3 heads; causal bottom-right; row 0 of batch 1 has no allowed key.
    Tensor<bool> allowed({2, 1, 4, 5}, true);
    for (Index j = 0; j < 5; ++j) allowed({1, 0, 0, j}) = false;
    allowed({0, 0, 2, 1}) = false;
    const Tensor<double> q({2, 3, 4, 2}), k({2, 3, 5, 2}), v({2, 3, 5, 2});
    for (const bool masked : {false, true}) {
        SdpaOptions options;
        options.is_causal = true;
        options.alignment = CausalAlignment::BottomRight;
        std::optional<TensorView<const bool>> mask;
        if (masked) mask = allowed.view();
        const auto p = make_sdpa_problem<double>("sdpa", q.view(), k.view(), v.view(), mask, options);
        std::optional<TensorView<const bool>> mask4;
        if (masked) mask4 = allowed.view().broadcast_to({2, 3, 4, 5}, "test", "allowed");
        const detail::HeadReadability heads =
            detail::head_readability(mask4, p.positions, 2, 3, 4, 5);
        Index first_empty = -1;
        for (Index b = 0; b < 2; ++b)
            for (Index h = 0; h < 3; ++h) {
                const Readability r = readability(p, b * 3 + h);
                for (Index i = 0; i < 4; ++i) CHECK(heads.nonempty(b, h, i) == bool(r.row_nonempty[std::size_t(i)]));
                for (Index j = 0; j < 5; ++j) CHECK(heads.readable(b, h, j) == bool(r.key_readable[std::size_t(j)]));
                if (first_empty < 0 && r.first_empty_row >= 0) first_empty = (b * 3 + h) * 4 + r.first_empty_row;
            }
        CHECK(heads.first_empty == first_empty);
        CHECK(first_empty == (masked ? 12 : -1));  // (b, h, i) = (1, 0, 0) under the mask
    }
}

TEST_CASE("the positional rule: a window's keys are FlashAttention's and JAX's inequalities, and readability their union",
          "[problem]") {
    // Every window with sides in [-1, 4], both alignments, with and without causal, on small (Tq, Tk): the rule's
    // range against the inequalities written out, and row_readability against a brute-force union.
    for (Index Tq = 0; Tq <= 5; ++Tq)
        for (Index Tk = 0; Tk <= 6; ++Tk)
            for (Index left = -1; left <= 4; ++left)
                for (Index right = -1; right <= 4; ++right)
                    for (const auto a : {CausalAlignment::TopLeft, CausalAlignment::BottomRight})
                        for (const bool causal : {false, true}) {
                            const PositionRule rule{causal, a, SlidingWindow{left, right, a}};
                            std::vector<char> rows(std::size_t(Tq) + 1), keys(std::size_t(Tk) + 1);
                            const Index first = detail::row_readability(nullptr, 0, 0, Tq, Tk, rule, rows.data(),
                                                                        keys.data());
                            std::vector<char> want_keys(std::size_t(Tk) + 1, 0);
                            Index want_first = -1;
                            for (Index i = 0; i < Tq; ++i) {
                                const Index d = a == CausalAlignment::TopLeft ? i : i + Tk - Tq;
                                bool any = false;
                                for (Index j = 0; j < Tk; ++j) {
                                    const bool in = (left < 0 || d - left <= j) && (right < 0 || j <= d + right) &&
                                                    (!causal || j <= d);
                                    CHECK(rule.allows(i, j, Tq, Tk) == in);
                                    if (in) any = true, want_keys[std::size_t(j)] = 1;
                                }
                                CHECK(bool(rows[std::size_t(i)]) == any);
                                if (!any && want_first < 0) want_first = i;
                            }
                            for (Index j = 0; j < Tk; ++j) CHECK(keys[std::size_t(j)] == want_keys[std::size_t(j)]);
                            CHECK(first == want_first);
                        }
}

TEST_CASE("a window with a side below -1 is refused by name", "[problem]") {
    const Tensor<double> q({2, 2}), k({3, 2}), v({3, 2});
    SdpaOptions options;
    options.window = SlidingWindow{-2, 0};
    const std::string m = test::error_message<ConfigError>(
        [&] { make_sdpa_problem<double>("sdpa", q.view(), k.view(), v.view(), std::nullopt, options); });
    CHECK_THAT(m, Contains("sdpa") && Contains("window (-2, 0) bottom-right") && Contains("q [2,2]"));
    CHECK_THROWS_AS(sliding_window_allowed_mask(2, 3, SlidingWindow{0, -5}), ConfigError);
}

TEST_CASE("a softcap that is negative, not finite or below the normal range of its type is refused by name", "[problem]") {
    const Tensor<float> q({2, 2}), k({3, 2}), v({3, 2});
    for (const double bad : {-1.0, std::nan(""), double(INFINITY), 1e39, 1e-39}) {
        SdpaOptions options;
        options.softcap = bad;
        const std::string m = test::error_message<ConfigError>(
            [&] { make_sdpa_problem<float>("sdpa", q.view(), k.view(), v.view(), std::nullopt, options); });
        CHECK_THAT(m, Contains("sdpa: softcap must be 0 (off) or a positive number") && Contains("q [2,2]"));
    }
    SdpaOptions ok;
    ok.softcap = 1e-37;  // normal in float
    CHECK(make_sdpa_problem<float>("sdpa", q.view(), k.view(), v.view(), std::nullopt, ok).softcap == 1e-37);
    ok.softcap = 1e39;  // beyond float, finite in double
    const Tensor<double> qd({2, 2}), kd({3, 2}), vd({3, 2});
    CHECK(make_sdpa_problem<double>("sdpa", qd.view(), kd.view(), vd.view(), std::nullopt, ok).softcap == 1e39);
}
