// `attn sdpa`: scaled dot-product attention on .npy files (q, k, v, optional allowed mask) -> output, weights.
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "attn/attn.hpp"
#include "commands.hpp"
#include "attn/io/npy.hpp"

namespace attn::cli {

namespace {

struct SdpaArgs {
    std::string q_path, k_path, v_path, allowed_mask_path, out_path, weights_path;
    std::string causal;  // "", "top-left" or "bottom-right"
    std::optional<double> scale;
    std::string empty_rows = "throw";
    std::string backend = "auto";
    int num_threads = 0;
    bool no_check_finite = false;
};

// q, k, v share the dtype T; the output and weights are written in T too.
template <class T>
void run_sdpa(const SdpaArgs& args, const npy::Array& q_file, const npy::Array& k_file, const npy::Array& v_file,
              const std::optional<Tensor<bool>>& allowed_mask) {
    const Tensor<T> q = npy::to_tensor<T>(q_file, args.q_path);  // (..., Tq, Dk)
    const Tensor<T> k = npy::to_tensor<T>(k_file, args.k_path);  // (..., Tk, Dk)
    const Tensor<T> v = npy::to_tensor<T>(v_file, args.v_path);  // (..., Tk, Dv)
    SdpaOptions options = sdpa_options_from(args.scale, args.causal, args.empty_rows, !args.no_check_finite);
    options.backend = args.backend == "reference" ? Backend::Reference
                      : args.backend == "tiled"   ? Backend::Tiled
                                                  : Backend::Auto;
    options.num_threads = args.num_threads;
    options.return_weights = !args.weights_path.empty();
    std::optional<TensorView<const bool>> allowed_view;
    if (allowed_mask) allowed_view = allowed_mask->view();  // broadcastable to (..., Tq, Tk)
    const SdpaResult<T> result = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed_view, options);
    npy::write_file<T>(args.out_path, result.output.view());                                   // (..., Tq, Dv)
    if (result.weights) npy::write_file<T>(args.weights_path, result.weights->view());  // (..., Tq, Tk)
}

int sdpa_command(const SdpaArgs& args) {
    const npy::Array q = npy::read_file(args.q_path);
    const npy::Array k = npy::read_file(args.k_path);
    const npy::Array v = npy::read_file(args.v_path);
    const auto describe = [](const char* tensor, const std::string& path, const npy::Array& a) {
        return std::string(tensor) + " (" + path + ") is " + npy::to_string(a.dtype) + " " + attn::to_string(a.shape);
    };
    if (q.dtype != k.dtype || q.dtype != v.dtype)
        throw ConfigError("sdpa: q, k and v must share a dtype: " + describe("q", args.q_path, q) + ", " +
                          describe("k", args.k_path, k) + ", " + describe("v", args.v_path, v));
    if (q.dtype != npy::DType::Float32 && q.dtype != npy::DType::Float64)
        throw ConfigError("sdpa: q, k and v must be float32 or float64: " + describe("q", args.q_path, q));
    std::optional<Tensor<bool>> allowed_mask;
    if (!args.allowed_mask_path.empty()) {
        const npy::Array m = npy::read_file(args.allowed_mask_path);
        if (m.dtype != npy::DType::Bool)
            throw ConfigError("sdpa: the allowed mask must be bool (true = may attend): " +
                              describe("allowed_mask", args.allowed_mask_path, m));
        allowed_mask = npy::to_tensor<bool>(m, args.allowed_mask_path);
    }
    if (q.dtype == npy::DType::Float32)
        run_sdpa<float>(args, q, k, v, allowed_mask);
    else
        run_sdpa<double>(args, q, k, v, allowed_mask);
    return 0;
}

}  // namespace

Action add_sdpa_command(CLI::App& app) {
    auto args = std::make_shared<SdpaArgs>();
    auto* sdpa = app.add_subcommand("sdpa", "Scaled dot-product attention on .npy files: softmax(scale q k^T, masked) v");
    sdpa->add_option("--q", args->q_path, "Queries (..., Tq, Dk), float32 or float64")->required();
    sdpa->add_option("--k", args->k_path, "Keys (..., Tk, Dk), same dtype as q")->required();
    sdpa->add_option("--v", args->v_path, "Values (..., Tk, Dv), same dtype as q")->required();
    sdpa->add_option("--allowed-mask", args->allowed_mask_path,
                     "Bool mask broadcastable to (..., Tq, Tk); true = the query may read the key");
    sdpa->add_option("--causal", args->causal, "Causal rule: top-left (j <= i) or bottom-right (j <= i + Tk - Tq)")
        ->check(CLI::IsMember({"top-left", "bottom-right"}));
    sdpa->add_option("--scale", args->scale, "Logit scale (default 1/sqrt(Dk))");
    sdpa->add_option("--empty-rows", args->empty_rows, "Rows with no allowed key: throw (error), zero or nan")
        ->capture_default_str()
        ->check(CLI::IsMember({"throw", "zero", "nan"}));
    sdpa->add_option("--backend", args->backend, "reference, tiled or auto")
        ->capture_default_str()
        ->check(CLI::IsMember({"reference", "tiled", "auto"}));
    sdpa->add_option("--threads", args->num_threads, "Threads (0: OpenMP's default); the result does not depend on it")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    sdpa->add_flag("--no-check-finite", args->no_check_finite,
                   "Do not reject NaN/Inf at readable positions (they then propagate to the output)");
    sdpa->add_option("--out", args->out_path, "Output (..., Tq, Dv), written in the dtype of q")->required();
    sdpa->add_option("--weights", args->weights_path, "Also write the attention weights (..., Tq, Tk)");
    return [sdpa, args]() -> int { return sdpa->parsed() ? sdpa_command(*args) : not_mine; };
}

}  // namespace attn::cli
