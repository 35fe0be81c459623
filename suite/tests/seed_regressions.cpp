// The seeded regression cases: one per bug class of "Behaviour users fought with" that applies to this library.
// A hidden test ("[.seed-regressions]"): `attn_properties_test "[.seed-regressions]"` (re)writes them into
// regressions/cases/; the committed files are its output, and ctest replays them like any other case file.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "attn/mask.hpp"
#include "attn/suite/property.hpp"
#include "generators.hpp"

using namespace attn;
using namespace attn::suite;

namespace {

// A case of the given shape with normal values from `seed` (rounded to the dtype).
SdpaCase base(Dtype dtype, Index B, Index H, Index Tq, Index Tk, Index Dk, Index Dv, std::uint64_t seed) {
    SdpaCase c;
    c.dtype = dtype;
    c.B = B, c.H = H, c.kv_heads = H, c.Tq = Tq, c.Tk = Tk, c.Dk = Dk, c.Dv = Dv;
    gen::fill_values(c, gen::Values::Normal, seed);
    c.aux_seed = seed;
    return c;
}

void save(SdpaCase c, const std::string& property, std::vector<std::string> kills, const std::string& note,
          const std::string& source) {
    CaseFile f;
    f.sdpa = std::move(c);
    f.property = property;
    f.implementation.assign(1, '*');  // every correct implementation
    f.kills = std::move(kills);
    f.note = note;
    f.source = source;
    const std::vector<std::string> problems = replay_case(f);
    for (const std::string& p : problems) FAIL_CHECK(p);
    std::cout << write_case_file(f, "regressions/cases") << "\n";
}

}  // namespace

TEST_CASE("write the seeded regression cases", "[.seed-regressions]") {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    {  // 1. an all-False mask row gives NaN (0/0)
        SdpaCase c = base(Dtype::Float, 1, 2, 4, 5, 3, 2, 101);
        Tensor<bool> m({4, 5}, true);
        for (Index j = 0; j < 5; ++j) m[2 * 5 + j] = false;  // query row 2 may read nothing
        c.allowed_mask = m;
        c.mask_kind = "empty-rows";
        save(c, "empty_rows_follow_the_policy", {"empty_rows_ignored"},
             "an all-False mask row must follow the policy (Throw names row 2, Zero gives 0), never 0/0 = NaN",
             "pytorch#103963, pytorch#103749");
    }
    {  // 2. fully masked rows: backends disagree; JAX's finite sentinel returns the mean of V and lets blocked keys win
        SdpaCase c = base(Dtype::Float, 1, 1, 2, 3, 2, 2, 102);
        // Logits near -2e9 for the allowed keys: a finite -1e9 sentinel would out-score them.
        for (Index x = 0; x < c.q.numel(); ++x) c.q[x] = 4.0e4;
        for (Index x = 0; x < c.k.numel(); ++x) c.k[x] = -4.0e4;
        Tensor<bool> m({2, 3}, true);
        m[0 * 3 + 2] = false;
        m[1 * 3 + 0] = false;
        c.allowed_mask = m;
        c.mask_kind = "random";
        c.distribution = "huge";
        save(c, "masked_keys_get_zero_weight", {"finite_mask_sentinel"},
             "blocked keys get exactly zero weight even when every allowed logit is below a finite sentinel like -1e9",
             "pytorch#110213, pytorch#109517 (JAX's finite -0.7*max sentinel)");
    }
    {  // 3. NaN inputs silently zeroed under the "0 for empty rows" rule
        SdpaCase c = base(Dtype::Double, 1, 1, 3, 4, 2, 2, 103);
        Tensor<bool> m({3, 4}, true);
        for (Index j = 0; j < 4; ++j) m[1 * 4 + j] = false;
        c.allowed_mask = m;
        c.mask_kind = "empty-rows";
        save(c, "empty_rows_follow_the_policy", {"nan_inputs_zeroed", "empty_rows_ignored"},
             "under EmptyRowPolicy::Zero a NaN input must still propagate; only empty rows become 0",
             "pytorch#141128");
    }
    {  // 4. NaN in a masked-out K/V position poisoned the output
        SdpaCase c = base(Dtype::Float, 2, 1, 3, 5, 4, 3, 104);
        c.allowed_mask = Tensor<bool>({2, 1, 1, 5}, {true, true, true, false, false, true, true, true, true, false});
        c.mask_kind = "padding";
        for (Index x = 0; x < 4; ++x) c.k[(0 * 5 + 3) * 4 + x] = nan, c.k[(0 * 5 + 4) * 4 + x] = inf;
        for (Index x = 0; x < 3; ++x) c.v[(0 * 5 + 3) * 3 + x] = nan, c.v[(1 * 5 + 4) * 3 + x] = -inf;
        c.distribution = "normal+garbage";
        save(c, "padding_values_do_not_matter", {"masked_nan_poisons_output"},
             "NaN and Inf in padded key/value rows must not reach the output (0 * NaN = NaN)", "pytorch#101967");
    }
    {  // 6. mask polarity: SDPA's true = attend vs nn.MultiheadAttention's true = ignore
        SdpaCase c = base(Dtype::Float, 1, 2, 4, 4, 3, 3, 106);
        c.allowed_mask = causal_allowed_mask(4, 4, CausalAlignment::TopLeft);
        c.mask_kind = "causal-tl";
        save(c, "blocked_and_allowed_conventions_agree", {"inverted_mask_polarity"},
             "an allowed causal mask read in the blocked convention hides the diagonal and the past",
             "pytorch PR #170415, pytorch#114083");
    }
    {  // 7. causal alignment when Tq != Tk: KV-cache decoding needs bottom-right
        SdpaCase c = base(Dtype::Double, 1, 2, 3, 7, 4, 2, 107);
        c.options.is_causal = true;
        c.options.alignment = CausalAlignment::BottomRight;
        c.mask_kind = "causal-br";
        save(c, "masked_keys_get_zero_weight", {"bottom_right_off_by_one", "causal_mask_transposed"},
             "bottom-right causal with Tq=3, Tk=7: query i reads keys j <= i + 4, exactly",
             "pytorch#108108, pytorch#103082, pytorch#144858");
    }
    {  // 8a. a key-padding mask broadcast from (B, 1, 1, Tk); a wrong unsqueeze makes fully masked rows
        SdpaCase c = base(Dtype::Float, 2, 2, 5, 5, 3, 2, 108);
        c.allowed_mask = Tensor<bool>({2, 1, 1, 5}, {true, true, true, false, false, true, true, true, true, true});
        c.mask_kind = "padding";
        save(c, "mask_broadcast_equals_expanded_mask", {"padding_on_query_rows"},
             "a (B, 1, 1, Tk) padding mask equals its expanded copy; unsqueezed on the query axis instead it empties "
             "query rows",
             "pytorch#120810 (mask broadcast from (..., S)), course module Part 3");
    }
    {  // 8b. stride-0 K/V (shared over heads) with kv_len = 1 mod 32
        SdpaCase c = base(Dtype::Float, 2, 4, 3, 33, 8, 4, 109);
        c.kv_heads = 1;
        gen::fill_values(c, gen::Values::Normal, 109);
        save(c, "matches_oracle_within_bound", {"gqa_head_mapping_wrong"},
             "K/V broadcast over heads by a stride-0 view with Tk = 33 = 1 mod 32 matches the oracle",
             "pytorch#191937");
    }
    {  // 9. overflow: logits beyond exp's range, no max subtraction
        SdpaCase c = base(Dtype::Float, 1, 1, 3, 4, 4, 2, 110);
        for (Index x = 0; x < c.q.numel(); ++x) c.q[x] = gen::round_to(Dtype::Float, c.q[x] * 12);
        for (Index x = 0; x < c.k.numel(); ++x) c.k[x] = gen::round_to(Dtype::Float, c.k[x] * 12);
        c.distribution = "large-logits";
        save(c, "matches_oracle_within_bound", {"no_max_subtraction"},
             "logits of a few hundred overflow exp unless the row maximum is subtracted first",
             "pytorch#119131, course module Part 7");
    }
    {  // 10. sequence length > 65536: index arithmetic in 32 bits
        SdpaCase c;
        c.dtype = Dtype::Float;
        c.B = 1, c.H = 1, c.kv_heads = 1, c.Tq = 2, c.Tk = 65537 + 3, c.Dk = 1, c.Dv = 1;
        c.q = Tensor<double>({1, 1, 2, 1}, {0.5, -0.25});
        c.k = Tensor<double>({1, 1, c.Tk, 1});
        c.v = Tensor<double>({1, 1, c.Tk, 1});
        for (Index j = 0; j < c.Tk; ++j) c.k[j] = static_cast<double>(j % 7) - 3, c.v[j] = static_cast<double>(j % 5);
        c.k[c.Tk - 1] = 8, c.v[c.Tk - 1] = -16;  // the last key (index 65539) dominates query 0
        c.distribution = "patterned";
        save(c, "matches_oracle_within_bound", {},
             "Tk = 65540: every index past 65536 must address the right key (64-bit indices)", "pytorch#162588");
    }
}
