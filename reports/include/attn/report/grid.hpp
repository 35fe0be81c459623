// attn/report/grid.hpp: the accuracy report's grid (shapes x input distributions x masks) and its seeded inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn::report {

// How the inputs of a case are drawn (see make_inputs for the exact recipes).
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
};

enum class DType { Float, Double };

const char* to_string(Distribution distribution);  // "normal", "large-logits", "near-ties", "wide-range", "subnormal"
const char* to_string(MaskKind mask_kind);          // "none", "causal-tl", "causal-br", "padding", "random"
const char* to_string(DType dtype);                 // "float", "double"

// One grid point, independent of the implementation and the dtype.
struct Case {
    std::string sweep;  // which sweep it belongs to: "tk", "dk", "logit-scale", "grid" (plots select by it)
    Index B = 1, H = 1, Tq = 1, Tk = 1, Dk = 1, Dv = 1;
    MaskKind mask_kind = MaskKind::None;
    Distribution distribution = Distribution::Normal;
    double logit_std = 1;  // only meaningful (and only printed) for LargeLogits
};

// The config string naming a report row, as in every failure message of the suite:
// sdpa(B=1,H=2,Tq=7,Tk=9,Dk=16,Dv=8,mask=causal-br,dist=near-ties,impl=reference,dtype=float).
// Large-logit cases carry their logit standard deviation after dist: dist=large-logits,logit_std=64.
std::string config_string(const Case& c, const std::string& impl, DType dtype);
// The same without impl and dtype: the seed of the case's inputs, so every implementation and both dtypes
// see the same draws.
std::string case_string(const Case& c);

enum class GridKind {
    Smoke,  // a handful of small cases, for tests
    Quick,  // CI: every distribution x mask, Tk up to 4096, Dk up to 512, about a minute on 2 cores
    Full,   // nightly: denser sweeps, larger batches, Tk up to 16384
};

const char* to_string(GridKind grid);
GridKind grid_from_string(const std::string& name);  // ConfigError listing the names otherwise
std::vector<Case> make_grid(GridKind grid);

// The inputs of one case in dtype T: q (B, H, Tq, Dk), k (B, H, Tk, Dk), v (B, H, Tk, Dv), the allowed mask when
// the case has an explicit one ((B, 1, 1, Tk) padding or (B, H, Tq, Tk) random) and the options (causal flag and
// alignment; empty rows, which bottom-right causal masks with Tq > Tk have, give zero rows).
template <class T>
struct Inputs {
    Tensor<T> q, k, v;
    std::optional<Tensor<bool>> allowed_mask;
    SdpaOptions options;
    std::optional<TensorView<const bool>> allowed_view() const {
        if (!allowed_mask) return std::nullopt;
        return allowed_mask->view();
    }
};

template <class T>
Inputs<T> make_inputs(const Case& c);

}  // namespace attn::report
