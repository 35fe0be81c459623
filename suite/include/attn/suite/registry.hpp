// attn/suite/registry.hpp: the implementation registry; the suite calls attention implementations only by name.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attn/oracle/oracle.hpp"
#include "attn/sdpa.hpp"

namespace attn::suite {

template <class T>
using SdpaFunction = std::function<SdpaResult<T>(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                                 std::optional<TensorView<const bool>> allowed_mask,
                                                 const SdpaOptions& options)>;

// One attention implementation as the suite sees it: the library's backends (`reference`, `tiled`), the
// multi-head path (`mha`), each deliberately wrong mutant, later external kernels.
struct Implementation {
    std::string name;
    std::string description;       // one sentence: what it is (for mutants: which bug it has)
    bool is_mutant = false;
    oracle::ErrorModel error_model;  // how its rounding errors are bounded
    bool returns_weights = true;     // honours options.return_weights (the tiled kernel never forms them)
    SdpaFunction<float> run_float;
    SdpaFunction<double> run_double;

    template <class T>
    SdpaResult<T> run(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                      std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) const {
        if constexpr (std::is_same_v<T, float>) return run_float(q, k, v, allowed_mask, options);
        else return run_double(q, k, v, allowed_mask, options);
    }
};

// Every registered implementation, in registration order (library backends first, then mutants).
const std::vector<Implementation>& implementations();
// The correct ones only (no mutants), and the mutants only.
std::vector<const Implementation*> correct_implementations();
std::vector<const Implementation*> mutants();
// By name; attn::ConfigError listing the known names when there is none.
const Implementation& implementation(const std::string& name);

}  // namespace attn::suite
