// attn/suite/case.hpp: one concrete SDPA test case (shapes, tensors, masks, options), its config string, its views
// and its JSON case file; what every property, generator, replay and report row shares.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>

#include "attn/sdpa.hpp"
#include "attn/suite/config.hpp"
#include "attn/tensor.hpp"

namespace attn::suite {

// Shapes (the letters of the whole project):
//   q (B, H, Tq, Dk); k (B, kv_heads, Tk, Dk); v (B, kv_heads, Tk, Dv); output (B, H, Tq, Dv).
//   kv_heads == H: one K/V head per query head. kv_heads == 1: K/V broadcast over the heads by a stride-0 view.
//   1 < kv_heads < H (grouped-query attention): q is viewed as (B, G, H/G, Tq, Dk) and k, v as (B, G, 1, Tk, D),
//   so query head h reads K/V head h / (H/G) through NumPy broadcasting.
// Values are stored as double; for a float case every value is exactly a float.
struct SdpaCase {
    Dtype dtype = Dtype::Double;
    Index B = 1, H = 1, Tq = 1, Tk = 1, Dk = 1, Dv = 1;
    Index kv_heads = 1;
    Tensor<double> q, k, v;
    // What the mask is, for the config string: none, causal-tl, causal-br (options.is_causal or an explicit causal
    // tensor), padding, causal-tl+padding, random, empty-rows, ...
    std::string mask_kind = "none";
    // Whether the mask was drawn with all-false rows (mask_kind "empty-rows", alone or with "+causal-tl|br").
    bool has_empty_rows() const { return mask_kind.starts_with("empty-rows"); }
    std::optional<Tensor<bool>> allowed_mask;  // explicit allowed mask in its own broadcastable shape (rank 2..4)
    bool mask_stride0 = false;                 // pass the mask expanded to (B, H, Tq, Tk) as a stride-0 view
    std::string distribution = "normal";       // how the values were drawn (config string only)
    // Set when the values and the mask follow from the recipe `distribution` with this seed (attn/suite/recipe.hpp):
    // the config string then names the case completely.
    std::optional<std::uint64_t> seed;
    std::optional<double> logit_std;           // the large-logits recipe's parameter
    // The additive bias (SdpaOptions::bias), in its own broadcastable shape (rank 1..4 against (B, H, Tq, Tk)), and
    // its kind for the config string (attn/suite/recipe.hpp, draw_bias). make_inputs passes it in the case's dtype;
    // options.bias itself stays unset (a case owns its tensors, options would hold a view).
    std::string bias_kind = "none";
    std::optional<Tensor<double>> bias;
    // ALiBi's slopes (SdpaOptions::alibi_slopes), (H) or (B, H), and their kind (draw_alibi: none, heads, batch).
    std::string alibi_kind = "none";
    std::optional<Tensor<double>> alibi_slopes;
    SdpaOptions options;
    std::uint64_t aux_seed = 0;                // seeds a property's own perturbations (SplitMix64, suite/rng.hpp)
    std::map<std::string, double> params;      // a property's own parameters (shift sizes, cut positions, ...)
};

// What the case is, run by `impl` (attn/suite/config.hpp), and its config string
// "sdpa(B=2,H=4,Tq=7,Tk=9,Dk=16,Dv=8,mask=causal-br,dtype=float,impl=reference)": used in messages, case file
// names, report rows and reproduction lines.
CaseConfig config_of(const SdpaCase& c, const std::string& impl);
std::string config_string(const SdpaCase& c, const std::string& impl);


// The views an implementation is called with, owning their storage. `output_shape` is (B, H, Tq, Dv) whatever
// the layout (the grouped-query layout has the same memory order).
template <class T>
struct CaseInputs {
    Tensor<T> q, k, v;
    std::optional<Tensor<bool>> allowed_storage;
    std::optional<Tensor<T>> bias_storage, alibi_storage;
    TensorView<const T> q_view, k_view, v_view;
    std::optional<TensorView<const bool>> allowed_view;
    std::optional<TensorView<const T>> bias_view, alibi_view;

    // `options` with the case's bias and ALiBi slopes (if any): what every call of an implementation or the oracle
    // on the case gets.
    SdpaOptions with_bias(SdpaOptions options) const {
        if (bias_view) options.bias = *bias_view;
        if (alibi_view) options.alibi_slopes = *alibi_view;
        return options;
    }
};

template <class T>
CaseInputs<T> make_inputs(const SdpaCase& c);

// Case files (regressions/cases/*.json): the case plus what it is for. Format documented in regressions/README.md.
struct CaseFile {
    SdpaCase sdpa;
    std::string property;        // the property's name (its file name)
    std::string implementation;  // where it failed; "*" = every correct implementation
    std::string expected = "holds";  // "holds": the property must hold for `implementation`
    std::vector<std::string> kills;  // mutants this case must still kill (replay checks it)
    std::string note;
    std::string source;          // where the bug class comes from (an issue thread), or "found by the suite"
};

std::string to_json(const CaseFile& file);
CaseFile case_from_json(const std::string& text, const std::string& origin);
CaseFile read_case_file(const std::string& path);
// Writes dir/<config>.<property>.json (creating dir) and returns the path.
std::string write_case_file(const CaseFile& file, const std::string& dir);

// For RapidCheck's counter-example printing.
void showValue(const SdpaCase& c, std::ostream& os);

// Tensors from nested shape + flat data helpers.
template <class T>
Tensor<T> cast_tensor(const Tensor<double>& t);

}  // namespace attn::suite
