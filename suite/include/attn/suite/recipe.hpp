// attn/suite/recipe.hpp: the inputs a config string with a seed names (the report's rows, `attn properties --case`).
//
// The values are drawn by SplitMix64 (attn/suite/rng.hpp) seeded with the config's `seed`, q then k then v in
// C order, rounded to the dtype as drawn; then the mask. Recipes (`values=`):
//   normal        q, k, v ~ N(0, 1): logits ~ N(0, 1) after the 1/sqrt(Dk) scale
//   large-logits  q, k ~ N(0, sqrt(logit_std)): logits ~ N(0, logit_std^2); v ~ N(0, 1)
//   near-ties     q, v ~ N(0, 1); per (batch, K/V head) every key row is one N(0, 1) row times (1 + 2^-18 N(0, 1))
//   wide-range    random signs, |q|, |k| = 2^U(-3, 1), |v| = 2^U(-20, 20): forty binades in the weighted sum
//   subnormal     v = N(0, 1) x smallest normal x 2^U(-24, -1) (subnormal in the dtype); a quarter of q, k too
// Masks (`mask=`): none; causal-tl and causal-br (the is_causal option); padding-r4 ((B, 1, 1, Tk): batch b keeps its
// first max(1, Tk - (b+1) Tk / (2B+2)) keys); random-r4 ((B, H, Tq, Tk) fair coins, an empty row gets one key back);
// window (no tensor: the sliding window of the config's window= field).
// Biases (`bias=`, SdpaOptions::bias, drawn after the mask; draw_bias): see bias_kinds; then ALiBi's slopes
// (`alibi=`, draw_alibi): see alibi_kinds.
// The property generator's value kinds of the same names (suite/generators.hpp) are other recipes: a config
// without a seed names those, and its case file holds the values.
#pragma once

#include "attn/suite/case.hpp"
#include "attn/suite/config.hpp"
#include "attn/suite/rng.hpp"

namespace attn::suite {

// The case a config with a seed names; ConfigError (naming the field) when it has no seed or asks for a recipe,
// mask or layout there is none for.
SdpaCase make_case(const CaseConfig& config);

// The additive bias kinds, each a tensor in its own broadcastable shape, rounded to the case's dtype:
//   normal   (B, H, Tq, Tk) ~ N(0, 2^2)
//   large    (B, H, Tq, Tk) ~ U(-1000, 1000): the bias decides each row, the logits ride on top of it
//   alibi    (H, Tq, Tk) = -m_h |i + Tk - Tq - j|, m_h = 2^(-8 (h + 1) / H): ALiBi (bottom-right), written out
//   keys     (B, 1, 1, Tk) ~ N(0, 2^2): one bias per key (a soft key padding)
//   rows     (Tq, 1) ~ N(0, 10^2): constant along every row, so it changes no weight
//   matrix   (Tq, Tk) ~ N(0, 2^2): one bias for every batch element and head, PyTorch's usual float attn_mask
const std::vector<std::string>& bias_kinds();
// Sets c.bias (and c.bias_kind) of `kind` ("none": no bias) from rng; ConfigError naming the kinds otherwise.
void draw_bias(SdpaCase& c, const std::string& kind, Rng& rng);

// ALiBi's slope kinds (SdpaOptions::alibi_slopes), rounded to the case's dtype:
//   heads    (H) = attn::alibi_slopes(H), the standard schedule
//   batch    (B, H) ~ 2^U(-8, 1): a slope per batch element and head, steeper ones included
const std::vector<std::string>& alibi_kinds();
// Sets c.alibi_slopes (and c.alibi_kind) of `kind` ("none": no slopes) from rng; ConfigError naming the kinds
// otherwise.
void draw_alibi(SdpaCase& c, const std::string& kind, Rng& rng);

}  // namespace attn::suite
