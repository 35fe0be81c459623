// attn/suite/registry.hpp: the implementation registry; the suite calls attention implementations only by name.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/backward.hpp"
#include "attn/mha.hpp"
#include "attn/oracle/oracle.hpp"
#include "attn/sdpa.hpp"
#include "attn/suite/config.hpp"

namespace attn::suite {

template <class T>
using SdpaFunction = std::function<SdpaResult<T>(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                                 std::optional<TensorView<const bool>> allowed_mask,
                                                 const SdpaOptions& options)>;

// The backward pass of an implementation: its own forward on these inputs, then its gradients of sum(dout * output)
// (attn/backward.hpp's contracts; dout of the output's shape).
template <class T>
using BackwardFunction = std::function<SdpaGradients<T>(TensorView<const T> q, TensorView<const T> k,
                                                        TensorView<const T> v, TensorView<const T> dout,
                                                        std::optional<TensorView<const bool>> allowed_mask,
                                                        const SdpaOptions& options)>;

// The MHA head path's backward, attn::multi_head_sdpa_backward's signature (training mode drops weights again):
// q_projected (B, Tq, H*Dk), k_projected (B, Tk, G*Dk), v_projected (B, Tk, G*Dv), dout (B, Tq, H*Dv).
template <class T>
using HeadBackwardFunction = std::function<MhaGradients<T>(
    TensorView<const T> q_projected, TensorView<const T> k_projected, TensorView<const T> v_projected,
    TensorView<const T> dout, Index num_heads, Index num_kv_heads, std::optional<TensorView<const bool>> allowed_mask,
    const MhaOptions& options, const MhaDropout& dropout)>;

// A call outside what an implementation declares it supports (an external kernel without bool masks, a dtype it
// does not take, ...): the runner skips the case and counts it under this reason, which names no sizes so that
// equal reasons add up. Properties let it pass through their own exception handling.
class Unsupported : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// One attention implementation as the suite sees it: the library's backends (`reference`, `tiled`), the
// multi-head path (`mha`), each deliberately wrong mutant, external kernels (attn/kernel_abi.h).
struct Implementation {
    std::string name;
    std::string description;       // one sentence: what it is (for mutants: which bug it has)
    bool is_mutant = false;
    oracle::ErrorModel error_model;  // how its rounding errors are bounded
    bool returns_weights = true;     // honours options.return_weights (the tiled kernel never forms them)
    // Why it takes no additive bias or ALiBi slopes (SdpaOptions::bias, alibi_slopes; empty: it takes both): a
    // property whose every case carries one (Property::needs_bias) is then skipped with this reason.
    std::string bias_unsupported;
    // The dtypes it takes, each with why not when it does not (a run on another dtype is skipped with that reason).
    std::map<Dtype, std::string> dtype_unsupported;
    std::string kernel_path;   // external kernels: the shared library (else empty)
    std::string capabilities;  // external kernels: what it declares (KernelInfo::capabilities)
    // How a saved case is replayed, with {case} for its file; empty: `./attn properties [--kernel K] --replay`.
    std::string replay_template;
    SdpaFunction<float> run_float;
    SdpaFunction<double> run_double;
    // 16-bit storage (attn/half.hpp); empty where the implementation has no such path (dtype_unsupported says so).
    SdpaFunction<float16> run_float16;
    SdpaFunction<bfloat16> run_bfloat16;
    // The backward pass (empty where it has none): the gradient properties run only where it is. Its bound is
    // error_model's (backward_weights_from_lse, backward_d_from_output say which structure).
    BackwardFunction<float> backward_float;
    BackwardFunction<double> backward_double;
    BackwardFunction<float16> backward_float16;
    BackwardFunction<bfloat16> backward_bfloat16;
    bool has_backward() const {
        return bool(backward_float) || bool(backward_double) || bool(backward_float16) || bool(backward_bfloat16);
    }
    template <class T>
    SdpaGradients<T> backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                              TensorView<const T> dout, std::optional<TensorView<const bool>> allowed_mask,
                              const SdpaOptions& options) const {
        const BackwardFunction<T>* f = nullptr;
        if constexpr (std::is_same_v<T, float>) f = &backward_float;
        else if constexpr (std::is_same_v<T, double>) f = &backward_double;
        else if constexpr (std::is_same_v<T, float16>) f = &backward_float16;
        else f = &backward_bfloat16;
        if (!f || !*f) throw Unsupported(name + " has no " + to_string(dtype_of<T>()) + " backward pass");
        return (*f)(q, k, v, dout, allowed_mask, options);
    }

    // The head path's backward (empty where it has none): the dropout gradient property runs only where it is.
    HeadBackwardFunction<float> head_backward_float;
    HeadBackwardFunction<double> head_backward_double;
    HeadBackwardFunction<float16> head_backward_float16;
    HeadBackwardFunction<bfloat16> head_backward_bfloat16;
    bool has_head_backward() const { return bool(head_backward_float) || bool(head_backward_double); }
    template <class T>
    MhaGradients<T> head_backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                  TensorView<const T> dout, Index H, Index G,
                                  std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                  const MhaDropout& dropout) const {
        const HeadBackwardFunction<T>* f = nullptr;
        if constexpr (std::is_same_v<T, float>) f = &head_backward_float;
        else if constexpr (std::is_same_v<T, double>) f = &head_backward_double;
        else if constexpr (std::is_same_v<T, float16>) f = &head_backward_float16;
        else f = &head_backward_bfloat16;
        if (!*f) throw Unsupported(name + " has no " + to_string(dtype_of<T>()) + " head-path backward");
        return (*f)(q, k, v, dout, H, G, allowed_mask, options, dropout);
    }

    template <class T>
    const SdpaFunction<T>& function() const {
        if constexpr (std::is_same_v<T, float>) return run_float;
        else if constexpr (std::is_same_v<T, double>) return run_double;
        else if constexpr (std::is_same_v<T, float16>) return run_float16;
        else return run_bfloat16;
    }
    // Unsupported when it has no function for T.
    template <class T>
    SdpaResult<T> run(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                      std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) const {
        const SdpaFunction<T>& f = function<T>();
        if (!f) throw Unsupported(name + " has no " + to_string(dtype_of<T>()) + " path");
        return f(q, k, v, allowed_mask, options);
    }
};

// Every registered implementation, in registration order (library backends first, then mutants).
const std::vector<Implementation>& implementations();
// The correct ones only (no mutants), and the mutants only.
std::vector<const Implementation*> correct_implementations();
std::vector<const Implementation*> mutants();
// By name (registered or loaded external ones); attn::ConfigError listing the known names when there is none.
const Implementation& implementation(const std::string& name);
// The one with this name, or null.
const Implementation* find_implementation(const std::string& name);

// Loads an external kernel (attn/kernel_abi.h) in a worker process of its own and registers it under the name it
// declares (implementation() finds it; correct_implementations() does not list it). Calls run through the same
// validation and contracts as the suite's own kernels (attn::detail::problem), then through the kernel; a call it
// does not declare support for throws Unsupported. Throws attn::plugin::LoadError when the file is no usable kernel.
// `timeout_seconds`: how long one call may take before it counts as hung (then 1 s for the rest of the run).
const Implementation& load_external(const std::string& path, double timeout_seconds = 10.0);
// The same for a worker already running and connected (the Python module serving a callable; kernel_process.hpp):
// no timeout, no restart; its cases replay with attn.properties(fn, replay=...). `origin` says where it runs.
const Implementation& connect_external(int socket, int memfd, const std::string& origin);

}  // namespace attn::suite
