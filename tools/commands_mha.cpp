// `attn mha`: multi-head attention on .npy files with PyTorch's parameter layouts -> output (and weights).
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "attention_inputs.hpp"
#include "attn/attn.hpp"
#include "commands.hpp"
#include "attn/io/npy.hpp"

namespace attn::cli {

namespace {

struct MhaArgs : AttentionArgs {
    std::string x_path, memory_path, key_memory_path, value_memory_path;
    Index num_heads = 0;
    std::optional<Index> num_kv_heads;
    std::string q_weight, k_weight, v_weight, out_weight, in_proj_weight;
    std::string q_bias, k_bias, v_bias, out_bias, in_proj_bias;
    std::string allowed_mask_path, blocked_mask_path, key_padding_blocked_path;
    std::string key_padding_bias_path;  // float (B, Tk), in x's dtype (the bias and the slopes are AttentionArgs')
    std::string out_path, weights_path;
    bool average_weights = false;
    std::string dtype;  // --dtype: int16/uint16 files hold the bits of this 16-bit type
};

std::optional<Tensor<bool>> read_mask(const std::string& path, const char* what) {
    if (path.empty()) return std::nullopt;
    const npy::Array a = npy::read_file(path);
    if (a.dtype != npy::DType::Bool)
        throw ConfigError(std::string("mha: ") + what + " (" + path + ") must be bool, got " + npy::to_string(a.dtype));
    return npy::to_tensor<bool>(a, path);
}

template <class T>
int run_mha(const MhaArgs& args, const npy::Array& x_file) {
    // Every float file in x's dtype (after --dtype); to_tensor names the file that differs.
    const auto read = [&](const std::string& path) { return npy::to_tensor<T>(read_float_file(path, args.dtype), path); };
    const auto read_optional = [&](const std::string& path) {
        return path.empty() ? std::optional<Tensor<T>>() : std::optional<Tensor<T>>(read(path));
    };
    const Tensor<T> x = npy::to_tensor<T>(x_file, args.x_path);  // (B, Tq, E)
    const std::optional<Tensor<T>> memory = read_optional(args.memory_path);            // (B, Tk, kdim = vdim)
    const std::optional<Tensor<T>> key_memory = read_optional(args.key_memory_path);    // (B, Tk, kdim)
    const std::optional<Tensor<T>> value_memory = read_optional(args.value_memory_path);  // (B, Tk, vdim)
    if (x.rank() != 3)
        throw ShapeError("mha: x (" + args.x_path + ") must be (B, T, E), got " + to_string(x.shape()));
    const auto width = [](const std::optional<Tensor<T>>& t, Index fallback) { return t && t->rank() > 0 ? t->dim(-1) : fallback; };

    MhaConfig config;
    config.embed_dim = x.dim(2);
    config.num_heads = args.num_heads;
    config.num_kv_heads = args.num_kv_heads;
    config.kdim = memory ? width(memory, x.dim(2)) : width(key_memory, x.dim(2));
    config.vdim = memory ? width(memory, x.dim(2)) : width(value_memory, x.dim(2));
    // Missing biases are 0, as PyTorch initialises them; without any bias file the module has no biases.
    config.bias = !(args.q_bias.empty() && args.k_bias.empty() && args.v_bias.empty() && args.out_bias.empty() &&
                    args.in_proj_bias.empty());
    MultiHeadAttention<T> mha(config);
    if (!args.in_proj_weight.empty()) {
        mha.set_in_proj_weight(read(args.in_proj_weight));  // (3E, E)
    } else {
        mha.set_q_proj_weight(read(args.q_weight));  // (E, E)
        mha.set_k_proj_weight(read(args.k_weight));  // (G*Dh, kdim)
        mha.set_v_proj_weight(read(args.v_weight));  // (G*Dh, vdim)
    }
    mha.set_out_proj_weight(read(args.out_weight));  // (E, E)
    if (!args.in_proj_bias.empty()) mha.set_in_proj_bias(read(args.in_proj_bias));
    if (!args.q_bias.empty()) mha.set_q_proj_bias(read(args.q_bias));
    if (!args.k_bias.empty()) mha.set_k_proj_bias(read(args.k_bias));
    if (!args.v_bias.empty()) mha.set_v_proj_bias(read(args.v_bias));
    if (!args.out_bias.empty()) mha.set_out_proj_bias(read(args.out_bias));

    MhaOptions options = args.options<MhaOptions>("mha");
    const std::optional<Tensor<T>> bias = read_optional(args.bias_path);                          // PyTorch's float attn_mask
    const std::optional<Tensor<T>> key_padding_bias = read_optional(args.key_padding_bias_path);  // (B, Tk)
    const std::optional<Tensor<T>> alibi_slopes = read_optional(args.alibi_path);                 // (H) or (B, H)
    if (bias) options.bias = *bias;
    if (key_padding_bias) options.key_padding_bias = *key_padding_bias;
    if (alibi_slopes) options.alibi_slopes = *alibi_slopes;
    options.weights = args.weights_path.empty() ? MhaWeights::None
                      : args.average_weights    ? MhaWeights::HeadAverage
                                                : MhaWeights::PerHead;

    const TensorView<const T> keys = memory ? memory->view() : key_memory ? key_memory->view() : x.view();
    const TensorView<const T> values = memory ? memory->view() : value_memory ? value_memory->view() : x.view();
    const std::optional<Tensor<bool>> allowed_mask = read_mask(args.allowed_mask_path, "--allowed-mask");
    const std::optional<Tensor<bool>> blocked_mask = read_mask(args.blocked_mask_path, "--blocked-mask");
    const std::optional<Tensor<bool>> key_padding_blocked = read_mask(args.key_padding_blocked_path, "--key-padding-blocked");
    MhaResult<T> result;
    if (blocked_mask || (key_padding_blocked && !allowed_mask)) {
        // nn.MultiheadAttention's convention (true = ignore): the module's named adapter converts it once.
        std::optional<TensorView<const bool>> blocked_view, padding_view;
        if (blocked_mask) blocked_view = blocked_mask->view();
        if (key_padding_blocked) padding_view = key_padding_blocked->view();
        result = mha.forward_blocked(x.view(), keys, values, blocked_view, padding_view, options);
    } else {
        std::optional<Tensor<bool>> padding_allowed;  // the blocked key padding, converted once here
        if (key_padding_blocked) {
            padding_allowed = blocked_to_allowed(key_padding_blocked->view());
            options.key_padding_allowed = padding_allowed->view();
        }
        std::optional<TensorView<const bool>> allowed_view;
        if (allowed_mask) allowed_view = allowed_mask->view();
        result = mha.forward(x.view(), keys, values, allowed_view, options);
    }
    npy::write_file<T>(args.out_path, result.output.view());                            // (B, Tq, E)
    if (result.weights) npy::write_file<T>(args.weights_path, result.weights->view());  // (B, H, Tq, Tk) or (B, Tq, Tk)
    return 0;
}

int mha_command(const MhaArgs& args) {
    if (args.in_proj_weight.empty() && (args.q_weight.empty() || args.k_weight.empty() || args.v_weight.empty()))
        throw ConfigError("mha: give --q-proj-weight, --k-proj-weight and --v-proj-weight, or --in-proj-weight");
    if (!args.in_proj_weight.empty() && !(args.q_weight.empty() && args.k_weight.empty() && args.v_weight.empty()))
        throw ConfigError("mha: --in-proj-weight replaces --q-proj-weight, --k-proj-weight and --v-proj-weight; give one form");
    const npy::Array x = read_float_file(args.x_path, args.dtype);
    if (!is_float_dtype(x.dtype))
        throw ConfigError("mha: x must be float32, float64, float16 or bfloat16 (int16/uint16 bits with --dtype): " +
                          describe("x", args.x_path, x));
    return with_float_type(x.dtype, [&]<class T>() { return run_mha<T>(args, x); });
}

}  // namespace

Action add_mha_command(CLI::App& app) {
    auto args = std::make_shared<MhaArgs>();
    auto* mha = app.add_subcommand(
        "mha", "Multi-head attention on .npy files, parameters in PyTorch's layouts (nn.MultiheadAttention, batch_first)");
    mha->add_option("--x", args->x_path,
                    "Queries (B, Tq, E), float32, float64, float16 or bfloat16; also keys and values without a memory")
        ->required();
    mha->add_option("--dtype", args->dtype,
                    "Read int16/uint16 files as the bits of this 16-bit type (tensor.view(torch.int16).numpy()); "
                    "16-bit modules compute in float32 and round each projection and the attention once")
        ->check(CLI::IsMember({"bfloat16", "float16"}));
    auto* memory = mha->add_option("--memory", args->memory_path, "Keys and values for cross-attention (B, Tk, kdim)");
    auto* key_memory = mha->add_option("--key-memory", args->key_memory_path, "Keys (B, Tk, kdim)");
    auto* value_memory = mha->add_option("--value-memory", args->value_memory_path, "Values (B, Tk, vdim)");
    memory->excludes(key_memory)->excludes(value_memory);
    key_memory->needs(value_memory);
    value_memory->needs(key_memory);
    mha->add_option("--num-heads", args->num_heads, "H; E must be a multiple of it")->required();
    mha->add_option("--num-kv-heads", args->num_kv_heads, "G (default H): grouped-query (1: multi-query) attention");
    mha->add_option("--q-proj-weight", args->q_weight, "(E, E)");
    mha->add_option("--k-proj-weight", args->k_weight, "(G*E/H, kdim)");
    mha->add_option("--v-proj-weight", args->v_weight, "(G*E/H, vdim)");
    mha->add_option("--in-proj-weight", args->in_proj_weight, "Packed (3E, E) = [q; k; v], instead of the three above");
    mha->add_option("--out-proj-weight", args->out_weight, "(E, E)")->required();
    mha->add_option("--q-proj-bias", args->q_bias, "(E); missing biases are 0");
    mha->add_option("--k-proj-bias", args->k_bias, "(G*E/H)");
    mha->add_option("--v-proj-bias", args->v_bias, "(G*E/H)");
    mha->add_option("--in-proj-bias", args->in_proj_bias, "Packed (3E)");
    mha->add_option("--out-proj-bias", args->out_bias, "(E)");
    auto* allowed = mha->add_option("--allowed-mask", args->allowed_mask_path,
                                    "Bool, true = may attend: (Tq, Tk), (B, Tq, Tk) or (B, H, Tq, Tk), size-1 dims broadcast");
    auto* blocked = mha->add_option("--blocked-mask", args->blocked_mask_path,
                                    "Bool, true = ignore (nn.MultiheadAttention's attn_mask), same shapes");
    allowed->excludes(blocked);
    mha->add_option("--key-padding-blocked", args->key_padding_blocked_path,
                    "Bool (B, Tk), true = padding (nn.MultiheadAttention's key_padding_mask)");
    add_attention_options(mha, *args, problem_option_fields);
    add_attention_options(mha, *args, execution_option_fields);
    const OptionSpec& key_padding_bias = option_spec("key_padding_bias");
    mha->add_option(key_padding_bias.cli, args->key_padding_bias_path, key_padding_bias.help);
    mha->add_option("--out", args->out_path, "Output (B, Tq, E), in the dtype of x")->required();
    auto* weights = mha->add_option("--weights", args->weights_path, "Also write the weights (B, H, Tq, Tk)");
    mha->add_flag("--average-weights", args->average_weights, "Write the head average (B, Tq, Tk) instead")->needs(weights);
    return [mha, args]() -> int { return mha->parsed() ? mha_command(*args) : not_mine; };
}

}  // namespace attn::cli
