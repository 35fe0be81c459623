// attn/report/grid.hpp: the accuracy report's grid (shapes x input distributions x masks); each grid point is a
// config string with a seed, so its inputs are the suite's recipe (attn/suite/recipe.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "attn/suite/config.hpp"
#include "attn/tensor.hpp"

namespace attn::report {

using suite::Dtype;

// How the inputs of a case are drawn: the recipes of the same names (attn/suite/recipe.hpp).
enum class Distribution {
    Normal,       // q, k, v ~ N(0, 1): logits ~ N(0, 1) after the 1/sqrt(Dk) scale
    LargeLogits,  // q, k ~ N(0, sqrt(logit_std)): logits ~ N(0, logit_std^2); v ~ N(0, 1)
    NearTies,     // every key row is one row plus 2^-18-relative noise: logits differ by a few ulps
    WideRange,    // random signs, |q|, |k| = 2^U(-3, 1) and |v| = 2^U(-20, 20): forty binades in the weighted sum
    Subnormal,    // v subnormal in the dtype, a quarter of q and k subnormal: gradual underflow everywhere
};

enum class MaskKind {
    None,
    CausalTopLeft,      // is_causal, key j visible to query i iff j <= i
    CausalBottomRight,  // is_causal, iff j <= i + Tk - Tq (the KV-cache case)
    Padding,            // key padding (B, 1, 1, Tk): batch b keeps a prefix of its keys
    Random,             // (B, H, Tq, Tk) allowed mask, each key allowed with probability 1/2
    Window,             // the sliding window (4, 1) bottom-right (SdpaOptions::window): key j visible iff
                        // i + Tk - Tq - 4 <= j <= i + Tk - Tq + 1
};

const char* to_string(Distribution distribution);  // "normal", "large-logits", "near-ties", "wide-range", "subnormal"
const char* to_string(MaskKind mask_kind);  // "none", "causal-tl", "causal-br", "padding", "random", "window"
using suite::to_string;                             // Dtype: "float", "double"

// One grid point, independent of the implementation and the dtype.
struct Case {
    std::string sweep;  // which sweep it belongs to: "tk", "dk", "logit-scale", "softcap", "bias", "grid" (plots select by it)
    Index B = 1, H = 1, Tq = 1, Tk = 1, Dk = 1, Dv = 1;
    MaskKind mask_kind = MaskKind::None;
    Distribution distribution = Distribution::Normal;
    double logit_std = 1;  // only meaningful (and only printed) for LargeLogits
    double softcap = 0;    // SdpaOptions::softcap of the "softcap" sweep (0: off, not printed)
    // The "bias" sweep's additive bias and ALiBi slopes: the suite's recipe kinds (attn/suite/recipe.hpp's draw_bias
    // and draw_alibi; "none": off, not printed).
    std::string bias = "none", alibi = "none";
};

// The config of a report row: the case run by `impl` in `dtype`, with empty_rows=zero (bottom-right causal masks
// with Tq > Tk have empty rows) and the seed of the case, e.g.
// sdpa(B=1,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=causal-br,dtype=float,values=near-ties,seed=0x..,empty_rows=zero,impl=tiled).
// The seed is the FNV-1a hash of the case's seed text, so every implementation and both dtypes see the same draws.
suite::CaseConfig row_config(const Case& c, const std::string& impl, Dtype dtype);
std::string config_string(const Case& c, const std::string& impl, Dtype dtype);  // row_config(...).to_config()
// The other way: the case (all but its sweep, which no config names), the implementation and the dtype of a row's
// config string; IoError when it does not parse or names no report case (accuracy.json keeps rows this short).
void case_from_config(const std::string& config, Case& c, std::string& impl, Dtype& dtype);
// sdpa(B=..,H=..,Tq=..,Tk=..,Dk=..,Dv=..,mask=<kind>,dist=<distribution>[,logit_std=..]): what the seed hashes
// (the spelling of the report's first rows, kept so that every row keeps its inputs).
std::string seed_text(const Case& c);

enum class GridKind {
    Smoke,  // a handful of small cases, for tests
    Quick,  // CI: every distribution x mask, Tk up to 4096, Dk up to 512, seconds on 2 cores (6 s measured with the mutant table)
    Full,   // nightly: denser sweeps, larger batches, Tk up to 16384
};

const char* to_string(GridKind grid);
GridKind grid_from_string(const std::string& name);  // ConfigError listing the names otherwise
std::vector<Case> make_grid(GridKind grid);

}  // namespace attn::report
