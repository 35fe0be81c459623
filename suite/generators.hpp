// suite/generators.hpp: every RapidCheck generator of the suite, in one place (shapes, values, masks, options).
//
// Weighted like RapidCheck's own domain generators: edge sizes (T=1, D=1), Tq != Tk, huge and tiny magnitudes,
// near-ties and exact ties, logits beyond exp's overflow threshold, subnormals, every mask kind and broadcast rank,
// and grouped K/V heads, each drawn often enough that the coverage contracts (suite/coverage.hpp) are met within
// the default budget. Values are drawn from a seed with the suite's SplitMix64 so that a case is cheap to
// generate and shrinks by shape, kind and seed; the case file then stores every value exactly.
#pragma once

#include <rapidcheck.h>

#include "attn/suite/case.hpp"
#include "attn/suite/rng.hpp"

namespace attn::suite::gen {

// Which masks a property wants.
enum class Masks {
    Any,            // none, causal (both alignments, option or tensor), padding, causal+padding, random; no empty row
    None,           // no mask at all
    Blocking,       // at least one blocked (query, key) pair
    Causal,         // a causal rule (option or tensor), either alignment
    UnreadableKeys, // some key position that no query of its batch element may read
    Explicit,       // an explicit mask tensor only (no is_causal), any rank, maybe stride-0
    Broadcast,      // an explicit mask of rank 2 or 3, or rank 4 with size-1 dims, or a stride-0 view
    EmptyRows,      // at least one query row with no allowed key
    Window,         // a sliding window (SdpaOptions::window, either alignment), sometimes with the causal rule; no empty row
};

struct CaseSpec {
    Masks masks = Masks::Any;
    bool cross = false;         // force Tq != Tk
    bool self = false;          // force Tq == Tk and Dk == Dv (q, k, v may then be one tensor)
    bool grouped_kv = true;     // allow kv_heads < H
    bool small = false;         // keep shapes tiny (properties that call the implementation many times)
    bool force_grouped = false; // kv_heads < H always (shared or grouped K/V heads)
    bool very_long_keys = false;  // one case in ten has Tk in [257, 600): several key blocks of `tiled`
    // Soft-capping (SdpaOptions::softcap): one case in six caps its logits (softcap = false: never, for properties
    // whose statement is about the plain logits); force_softcap: every case does.
    bool softcap = true;
    bool force_softcap = false;
    // The additive bias (SdpaOptions::bias, attn/suite/recipe.hpp's kinds): with bias, one case in five carries one
    // and, independently, one in five ALiBi slopes; force_bias / force_alibi: every case does. Off by default: a
    // property that moves keys, queries or heads must move the bias with them, so each property that holds with a
    // bias says so.
    bool bias = false;
    bool force_bias = false;
    bool force_alibi = false;
};

// The special-value float generator (RapidCheck's gen::arbitrary<double> yields no NaN, Inf, subnormal or -0):
// NaN, +-Inf, +-0, the smallest and largest subnormals, random subnormals, +-max, +-min normal, 1 +- eps,
// huge and tiny normals, and ordinary values, each exactly representable in `dtype`.
rc::Gen<double> special_value(Dtype dtype);

// A whole case: shapes, values, mask and options per spec.
rc::Gen<SdpaCase> sdpa_case(Dtype dtype, CaseSpec spec = {});

// Value distributions (also used by targeted search to re-draw a case's values).
enum class Values { Normal, Uniform, Huge, Tiny, Subnormal, NearTies, Ties, LargeLogits };
const char* to_string(Values values);
// Fills q, k, v of `c` (shapes already set) from `seed`, rounding to c.dtype.
void fill_values(SdpaCase& c, Values values, std::uint64_t seed);

// Rounds x to the case's dtype (float cases hold only float values).
double round_to(Dtype dtype, double x);
// The dtype's smallest normal value (its inputs below it are subnormal), and the log of the largest finite value of
// the type it computes in (float for the 16-bit types): exp overflows beyond it.
double min_normal(Dtype dtype);
double log_max(Dtype dtype);

// A fresh random allowed mask of `shape` with density `density`, every row (last dim) non-empty.
Tensor<bool> random_allowed_mask(const Shape& shape, double density, Rng& rng);

}  // namespace attn::suite::gen
