// attn/oracle/sweep.hpp: the oracle's self-check sweep: random and adversarial cases through a library backend,
// each compared with the oracle's bound (no violation allowed) and summarised as worst and median tightness.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/oracle/metrics.hpp"

namespace attn::oracle {

struct SweepOptions {
    std::uint64_t seed = 20261130;
    Index cases = 200;
    bool adversarial = true;  // logits up to +-1e4, near-ties, Dk up to 1024, Tk up to 4096, values 1e-30..1e30
    Backend backend = Backend::Reference;
    ErrorModel model = reference_model();
};

struct SweepStats {
    std::string dtype;
    Index cases = 0;     // compared with the oracle
    Index skipped = 0;   // the backend refused the case with a documented attn::Error (e.g. logit overflow)
    Index violations = 0;           // cases with any element over its bound (output or weights)
    Index unbounded_elements = 0;   // elements whose bound is infinite
    double worst_tightness = 0;     // max over cases of the case's max error/bound (output)
    double median_tightness = 0;    // median over cases of the case's max error/bound (output)
    double worst_weights_tightness = 0, median_weights_tightness = 0;
    double max_oracle_error_ratio = 0;  // the oracle's own error / bound, max over cases
    std::string worst_case;         // config string of the case with the worst output tightness
    std::string worst_summary;      // its Comparison::summary()
    std::string first_violation;    // config + summary of the first violating case, if any
    std::string summary() const;
};

// One sweep for dtype T (float or double); deterministic for a given seed.
template <class T>
SweepStats sweep(const SweepOptions& options);

}  // namespace attn::oracle
