// attn/suite/config.hpp: the config string, the one name of a test case everywhere (property failures, case
// file names, report rows, the targeted search, reproduction lines), and its parser.
//
//   sdpa(B=2,H=4,Tq=7,Tk=9,Dk=16,Dv=8,mask=random-r3-stride0,kv_heads=2,dtype=float,values=near-ties,
//        seed=0x5eed,scale=0.5,empty_rows=zero,check_finite=off,threads=2,impl=tiled)
//
// Fields come in that fixed order; a field at its default is left out (kv_heads == H, values=normal, no seed, no
// scale, empty_rows=throw, check_finite on, threads=0), so every case has exactly one spelling and
// to_config(parse_config(s)) == s for every string the suite and the report write (a test checks it).
//
// What a config string pins down: the shapes, the dtype, the mask (its kind, the rank of the mask tensor passed, a
// stride-0 view), the options and the implementation. The values are pinned down only when the string has a
// `seed`: then `values` names a recipe (attn/suite/recipe.hpp) and the inputs follow from the string alone, so
// `attn properties --case '<config>'` and `attn report --filter '<config>'` rerun exactly that case. Without a seed,
// `values` only says how the property generator drew them, and the case file (regressions/) holds them exactly.
//
// New kinds of case (dtypes, attention variants, a backward direction) are new values of these fields or new
// optional fields here, never a second format.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "attn/sdpa.hpp"

namespace attn::suite {

// The element type of a case: float32, float64, or a 16-bit storage type (attn/half.hpp) computed in float32.
enum class Dtype { Float, Double, Float16, BFloat16 };
const char* to_string(Dtype dtype);  // "float", "double", "float16", "bfloat16"
using attn::to_string;
// The dtype of a name to_string gives; ConfigError naming `context` and the known names otherwise.
Dtype dtype_from_string(const std::string& name, const std::string& context);
// Every dtype, in the order runs and tables go through them.
const std::vector<Dtype>& all_dtypes();
// x rounded to nearest in the dtype (ties to even; the 16-bit types gradual below their normal range).
double round_to_dtype(Dtype dtype, double x);
// The next value of the dtype above x (x a finite value of it).
double next_up_in(Dtype dtype, double x);
// The type a case of this dtype scales its logits in (float for the 16-bit types): a scale is a value of it.
inline bool scale_is_float(Dtype dtype) { return dtype != Dtype::Double; }

template <class T>
constexpr Dtype dtype_of() {
    if constexpr (std::is_same_v<T, float>) return Dtype::Float;
    else if constexpr (std::is_same_v<T, double>) return Dtype::Double;
    else if constexpr (std::is_same_v<T, float16>) return Dtype::Float16;
    else {
        static_assert(std::is_same_v<T, bfloat16>, "a case's dtype is float, double, float16 or bfloat16");
        return Dtype::BFloat16;
    }
}

struct CaseConfig {
    std::string op = "sdpa";
    Index B = 1, H = 1, Tq = 1, Tk = 1, Dk = 1, Dv = 1;
    // none, causal-tl, causal-br (options.is_causal, or an explicit causal tensor when mask_rank > 0), padding,
    // causal-tl+padding, random, empty-rows.
    std::string mask = "none";
    Index mask_rank = 0;       // rank of the explicit allowed-mask tensor as stored (0: none)
    bool mask_stride0 = false; // passed expanded to (B, H, Tq, Tk) as a stride-0 view
    // options.window, written window=LEFT:RIGHT:tl|br ("window=256:0:br"; -1 = unbounded), and-ed with the mask.
    std::optional<SlidingWindow> window;
    Index kv_heads = 1;        // K/V heads: H, 1 (broadcast) or a divisor of H (grouped-query attention)
    Dtype dtype = Dtype::Double;
    std::string values = "normal";  // the value distribution (a recipe name when `seed` is set)
    std::optional<double> logit_std;  // the large-logits recipe's logit standard deviation
    std::optional<std::uint64_t> seed;
    std::optional<double> scale;
    std::optional<double> softcap;  // options.softcap when not 0, written softcap=C like the scale
    // The additive bias's kind (SdpaCase::bias_kind, attn/suite/recipe.hpp's draw_bias), written bias=KIND when
    // not none.
    std::string bias = "none";
    // ALiBi's slopes (SdpaCase::alibi_kind, draw_alibi), written alibi=KIND when not none.
    std::string alibi = "none";
    EmptyRowPolicy empty_rows = EmptyRowPolicy::Throw;
    bool check_finite = true;
    int threads = 0;
    std::string impl;  // implementation name; "all" for every correct one

    std::string to_config() const;
    bool operator==(const CaseConfig&) const = default;
};

// Parses a config string; ConfigError naming the string and the field when it is not one (unknown or repeated
// field, missing shape, a value that does not parse). Fields may come in any order; to_config() writes the
// canonical one.
CaseConfig parse_config(const std::string& text);

// The fields of a config string or of a filter: "sdpa(B=1,mask=none)" -> {{"op","sdpa"},{"B","1"},{"mask","none"}};
// a bare "impl=tiled,dtype=float" gives its pairs without "op".
std::vector<std::pair<std::string, std::string>> config_fields(const std::string& text);

// A row or case selector: a whole config string matches exactly that string; a list of fields
// ("impl=tiled,mask=causal-br,Tk=4096") matches every config string having each of them, a field left out of the
// string counting as its default (values=normal, empty_rows=throw, ...) and a mask also by its bare kind
// ("mask=random" matches mask=random-r3); "" matches everything; alternatives separated by '|' match what any of
// them matches ("impl=blis|mask=window,Tq=16384"). ConfigError for an unknown field.
bool config_matches(const std::string& config, const std::string& filter);
// ConfigError unless `filter` is one config_matches can use (a whole config string that parses, or known fields).
void check_filter(const std::string& filter);

// Exact decimal of a double, as short as round-tripping allows ("0.3", "2", "1e-05"); with a dtype, a value that
// is exactly a float is written as the shortest float ("0.3" for 0.3f): the scale of a float case is a float.
std::string format_number(double x);
std::string format_number(double x, Dtype dtype);

}  // namespace attn::suite
