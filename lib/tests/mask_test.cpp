// Masks in the allowed convention: causal in both alignments, key padding, combination, blocked adapters.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>

#include "attn/mask.hpp"
#include "error_message.hpp"

using namespace attn;
using Catch::Contains;

namespace {

// Rows of '1' (allowed) and '0' (blocked), e.g. {"1000", "1100"}; compares a (Tq, Tk) mask exactly.
void require_pattern(const Tensor<bool>& allowed_mask, const std::vector<std::string>& rows) {
    REQUIRE(allowed_mask.rank() == 2);
    REQUIRE(allowed_mask.dim(0) == static_cast<Index>(rows.size()));
    for (Index i = 0; i < allowed_mask.dim(0); ++i) {
        std::string got;
        for (Index j = 0; j < allowed_mask.dim(1); ++j) got += allowed_mask({i, j}) ? '1' : '0';
        INFO("query row " << i);
        CHECK(got == rows[static_cast<std::size_t>(i)]);
    }
}

}  // namespace

TEST_CASE("the 4x4 causal mask lets query i read keys 0..i", "[mask]") {
    require_pattern(causal_allowed_mask(4, 4, CausalAlignment::TopLeft), {"1000", "1100", "1110", "1111"});
    // With Tq == Tk both alignments are the same rule.
    require_pattern(causal_allowed_mask(4, 4, CausalAlignment::BottomRight), {"1000", "1100", "1110", "1111"});
}

TEST_CASE("top-left and bottom-right causal masks differ exactly as documented when Tq != Tk", "[mask]") {
    // Tq=3 < Tk=5: bottom-right shifts the diagonal right by Tk - Tq = 2, so the last query sees every key.
    require_pattern(causal_allowed_mask(3, 5, CausalAlignment::TopLeft), {"10000", "11000", "11100"});
    require_pattern(causal_allowed_mask(3, 5, CausalAlignment::BottomRight), {"11100", "11110", "11111"});
    // Tq=5 > Tk=3: bottom-right leaves the first Tq - Tk rows empty; top-left fills the last rows.
    require_pattern(causal_allowed_mask(5, 3, CausalAlignment::TopLeft), {"100", "110", "111", "111", "111"});
    require_pattern(causal_allowed_mask(5, 3, CausalAlignment::BottomRight), {"000", "000", "100", "110", "111"});
    // Decoding one new token against a KV cache of 6: bottom-right sees everything, top-left only key 0.
    require_pattern(causal_allowed_mask(1, 6, CausalAlignment::BottomRight), {"111111"});
    require_pattern(causal_allowed_mask(1, 6, CausalAlignment::TopLeft), {"100000"});
    CHECK(std::string(to_string(CausalAlignment::BottomRight)) == "bottom-right");
    const std::string m = test::error_message<ShapeError>([] { causal_allowed_mask(-1, 2, CausalAlignment::TopLeft); });
    CHECK_THAT(m, Contains("causal_allowed_mask") && Contains("Tq=-1"));
}

TEST_CASE("a key padding mask from token ids (B, Tk) has shape (B, 1, 1, Tk) and blocks the pad id", "[mask]") {
    const Tensor<std::int64_t> token_ids({2, 5}, {5, 7, 9, 0, 0, 3, 0, 0, 0, 0});
    const Tensor<bool> allowed = key_padding_allowed_mask(token_ids.view(), 0);
    REQUIRE(allowed.shape() == Shape{2, 1, 1, 5});
    const bool expected[] = {true, true, true, false, false, true, false, false, false, false};
    for (Index i = 0; i < 10; ++i) CHECK(allowed[i] == expected[i]);
    const Tensor<std::int64_t> flat({5}, {1, 2, 3, 4, 5});
    const std::string m = test::error_message<ShapeError>([&] { key_padding_allowed_mask(flat.view(), 0); });
    CHECK_THAT(m, Contains("key_padding_allowed_mask") && Contains("token_ids") && Contains("[5]"));
}

TEST_CASE("causal and padding combine with logical_and, broadcasting to (B, 1, T, T)", "[mask]") {
    const Tensor<std::int64_t> token_ids({2, 4}, {5, 7, 0, 0, 3, 4, 8, 0});
    const Tensor<bool> key_padding = key_padding_allowed_mask(token_ids.view(), 0);  // (2, 1, 1, 4)
    const Tensor<bool> causal = causal_allowed_mask(4, 4, CausalAlignment::TopLeft);  // (4, 4)
    const Tensor<bool> both = logical_and(causal.view(), key_padding.view());         // (2, 1, 4, 4)
    REQUIRE(both.shape() == Shape{2, 1, 4, 4});
    for (Index b = 0; b < 2; ++b)
        for (Index i = 0; i < 4; ++i)
            for (Index j = 0; j < 4; ++j) {
                INFO("b=" << b << " i=" << i << " j=" << j);
                CHECK(both({b, 0, i, j}) == (j <= i && token_ids({b, j}) != 0));
            }
    const std::string m =
        test::error_message<ShapeError>([&] { logical_and(causal.view(), Tensor<bool>({3}).view()); });
    CHECK_THAT(m, Contains("logical_and") && Contains("[4,4]") && Contains("[3]"));
}

TEST_CASE("blocked and allowed adapters are inverses and keep the causal diagonal readable", "[mask]") {
    std::mt19937_64 rng(7);
    Tensor<bool> allowed({2, 3, 5, 7});
    for (Index i = 0; i < allowed.numel(); ++i) allowed[i] = (rng() & 1) != 0;
    const Tensor<bool> blocked = allowed_to_blocked(allowed.view());
    const Tensor<bool> back = blocked_to_allowed(blocked.view());
    REQUIRE(back.shape() == allowed.shape());
    for (Index i = 0; i < allowed.numel(); ++i) {
        CHECK(blocked[i] == !allowed[i]);
        CHECK(back[i] == allowed[i]);
    }
    for (Index T : {1, 2, 5, 9}) {
        const Tensor<bool> causal_blocked = allowed_to_blocked(causal_allowed_mask(T, T, CausalAlignment::TopLeft).view());
        for (Index i = 0; i < T; ++i) CHECK_FALSE(causal_blocked({i, i}));
    }
    // The adapters work on views too (a transposed mask is read in its logical order).
    const Tensor<bool> causal = causal_allowed_mask(3, 3, CausalAlignment::TopLeft);
    const Tensor<bool> transposed_blocked = allowed_to_blocked(causal.view().transpose(0, 1));  // allowed: j >= i
    CHECK(transposed_blocked({1, 0}));
    CHECK_FALSE(transposed_blocked({0, 1}));
}

TEST_CASE("broadcast_allowed_mask stretches 1-D to 4-D masks to (..., Tq, Tk) or names both shapes", "[mask]") {
    const Tensor<bool> keys({5}, {true, false, true, true, false});
    const auto b = broadcast_allowed_mask(keys.view(), {2, 3, 4, 5}, "sdpa");
    CHECK(b.shape() == Shape{2, 3, 4, 5});
    CHECK(b({1, 2, 3, 1}) == false);
    CHECK(b({1, 2, 3, 2}) == true);
    const std::string m =
        test::error_message<ShapeError>([&] { broadcast_allowed_mask(keys.view(), {2, 3, 4, 6}, "sdpa"); });
    CHECK_THAT(m, Contains("sdpa") && Contains("allowed_mask [5]") && Contains("[2,3,4,6]"));
}
