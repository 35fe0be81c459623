// `attn sdpa`: scaled dot-product attention on .npy files (q, k, v, optional allowed mask) -> output, weights.
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attention_inputs.hpp"
#include "attn/attn.hpp"
#include "attn/io/npy.hpp"
#include "commands.hpp"
#if ATTN_HAVE_REPORTS
#include "attn/report/weights_map.hpp"
#endif

namespace attn::cli {

namespace {

struct SdpaArgs : AttentionArgs {
    std::string q_path, k_path, v_path, allowed_mask_path, out_path, weights_path;
    std::string dtype;  // --dtype: int16/uint16 files hold the bits of this 16-bit type
    std::string plot_weights_path, head;  // --plot-weights FILE.svg, --head I,J,... (the batch element it shows)
};

// --head "1,3" -> the flat index (C order) of that element of the batch shape; "" is element 0.
Index batch_element(const std::string& head, const Shape& batch_shape) {
    std::vector<Index> idx;
    std::stringstream list(head);
    std::string part;
    while (std::getline(list, part, ',')) {
        try {
            std::size_t used = 0;
            idx.push_back(std::stoll(part, &used));
            if (used != part.size()) throw std::invalid_argument(part);
        } catch (const std::exception&) {
            throw ConfigError("sdpa: --head " + head + " is not a list of integers (one per batch dim of " +
                              to_string(batch_shape) + ")");
        }
    }
    if (head.empty()) idx.assign(batch_shape.size(), 0);
    bool inside = idx.size() == batch_shape.size();
    for (std::size_t d = 0; inside && d < idx.size(); ++d) inside = idx[d] >= 0 && idx[d] < batch_shape[d];
    if (!inside)
        throw ConfigError("sdpa: --head " + head + " is not an element of the batch shape " + to_string(batch_shape) +
                          " (one index per batch dim, e.g. B,H for 4-D inputs)");
    Index flat = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) flat = flat * batch_shape[d] + idx[d];
    return flat;
}

// q, k, v share the dtype T; the output and weights are written in T too.
template <class T>
void run_sdpa(const SdpaArgs& args, const AttentionFiles& in) {
    const Tensor<T> q = npy::to_tensor<T>(in.q, args.q_path);  // (..., Tq, Dk)
    const Tensor<T> k = npy::to_tensor<T>(in.k, args.k_path);  // (..., Tk, Dk)
    const Tensor<T> v = npy::to_tensor<T>(in.v, args.v_path);  // (..., Tk, Dv)
    SdpaOptions options = args.options<SdpaOptions>("sdpa");
    options.return_weights = !args.weights_path.empty() || !args.plot_weights_path.empty();
    const std::optional<Tensor<T>> bias = in.bias_tensor<T>();  // broadcastable to (..., Tq, Tk)
    if (bias) options.bias = *bias;
    const std::optional<Tensor<T>> slopes = in.alibi_tensor<T>();  // broadcastable to (...)
    if (slopes) options.alibi_slopes = *slopes;
    std::optional<TensorView<const bool>> allowed_view;
    if (in.allowed_mask) allowed_view = in.allowed_mask->view();  // broadcastable to (..., Tq, Tk)
    const SdpaResult<T> result = scaled_dot_product_attention(q.view(), k.view(), v.view(), allowed_view, options);
    npy::write_file<T>(args.out_path, result.output.view());                            // (..., Tq, Dv)
    if (result.weights && !args.weights_path.empty())
        npy::write_file<T>(args.weights_path, result.weights->view());  // (..., Tq, Tk)
    if (args.plot_weights_path.empty()) return;
#if ATTN_HAVE_REPORTS
    const Shape& w_shape = result.weights->shape();  // (batch..., Tq, Tk)
    const Shape batch_shape(w_shape.begin(), w_shape.end() - 2);
    const Index b = batch_element(args.head, batch_shape);
    std::string title = "attention weights, batch element " +
                        (args.head.empty() ? to_string(Shape(batch_shape.size(), 0)) : "[" + args.head + "]");
    const report::WeightsMap map =
        report::weights_map<T>("sdpa", q.view(), k.view(), v.view(), allowed_view, options, result.weights->view(), b,
                               std::move(title));
    const std::string problem = report::write_weights_map(map, args.plot_weights_path);
    if (!problem.empty()) throw IoError("sdpa: --plot-weights " + args.plot_weights_path + ": " + problem);
#else
    throw ConfigError("sdpa: --plot-weights needs the report library (configure with ATTN_BUILD_REPORTS on)");
#endif
}

int sdpa_command(const SdpaArgs& args) {
    const AttentionFiles in =
        read_attention_files("sdpa", args.q_path, args.k_path, args.v_path, args.allowed_mask_path, args.dtype,
                             args.bias_path, args.alibi_path);
    with_float_type(in.q.dtype, [&]<class T>() { run_sdpa<T>(args, in); });
    return 0;
}

}  // namespace

Action add_sdpa_command(CLI::App& app) {
    auto args = std::make_shared<SdpaArgs>();
    auto* sdpa = app.add_subcommand("sdpa", "Scaled dot-product attention on .npy files: softmax(scale q k^T, masked) v");
    sdpa->add_option("--q", args->q_path, "Queries (..., Tq, Dk): float32, float64, float16 or bfloat16")->required();
    sdpa->add_option("--k", args->k_path, "Keys (..., Tk, Dk), same dtype as q")->required();
    sdpa->add_option("--v", args->v_path, "Values (..., Tk, Dv), same dtype as q")->required();
    sdpa->add_option("--allowed-mask", args->allowed_mask_path,
                     "Bool mask broadcastable to (..., Tq, Tk); true = the query may read the key");
    add_attention_options(sdpa, *args, problem_option_fields);
    add_attention_options(sdpa, *args, execution_option_fields);
    sdpa->add_option("--dtype", args->dtype,
                     "Read int16/uint16 inputs as the bits of this 16-bit type (tensor.view(torch.int16).numpy())")
        ->check(CLI::IsMember({"bfloat16", "float16"}));
    sdpa->add_option("--out", args->out_path,
                     "Output (..., Tq, Dv), written in the dtype of q (bfloat16 to .npy as its int16 bits)")
        ->required();
    sdpa->add_option("--weights", args->weights_path, "Also write the attention weights (..., Tq, Tk)");
    sdpa->add_option("--plot-weights", args->plot_weights_path,
                     "Draw the weights of one batch element as a heatmap (SVG, gnuplot): log colour scale, the keys a "
                     "query may not read in grey, the causal diagonal and window edges as lines");
    sdpa->add_option("--head", args->head,
                     "The batch element --plot-weights draws, one index per batch dim (B,H for 4-D inputs; default "
                     "the first)");
    return [sdpa, args]() -> int { return sdpa->parsed() ? sdpa_command(*args) : not_mine; };
}

}  // namespace attn::cli
