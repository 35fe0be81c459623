// The attention commands' input files, read and checked in one place.
#include "attention_inputs.hpp"

#include "attn/error.hpp"

namespace attn::cli {

std::string describe(const char* tensor, const std::string& path, const npy::Array& a) {
    return std::string(tensor) + " (" + path + ") is " + npy::to_string(a.dtype) + " " + attn::to_string(a.shape);
}

std::optional<npy::DType> sixteen_bit_dtype(const std::string& option) {
    if (option.empty()) return std::nullopt;
    if (option == "bfloat16") return npy::DType::BFloat16;
    if (option == "float16") return npy::DType::Float16;
    throw ConfigError("--dtype must be bfloat16 or float16, got '" + option + "'");
}

npy::Array read_float_file(const std::string& path, const std::string& dtype_option) {
    npy::Array a = npy::read_file(path);
    if (const auto as = sixteen_bit_dtype(dtype_option)) a = npy::as_dtype(std::move(a), *as, path);
    return a;
}

AttentionFiles read_attention_files(const std::string& command, const std::string& q_path, const std::string& k_path,
                                    const std::string& v_path, const std::string& allowed_mask_path,
                                    const std::string& dtype_option, const std::string& bias_path,
                                    const std::string& alibi_path) {
    AttentionFiles in{read_float_file(q_path, dtype_option), read_float_file(k_path, dtype_option),
                      read_float_file(v_path, dtype_option), std::nullopt, std::nullopt, std::nullopt, {}, {}};
    if (in.q.dtype != in.k.dtype || in.q.dtype != in.v.dtype)
        throw ConfigError(command + ": q, k and v must share a dtype: " + describe("q", q_path, in.q) + ", " +
                          describe("k", k_path, in.k) + ", " + describe("v", v_path, in.v));
    const npy::DType d = in.q.dtype;
    if (!is_float_dtype(d))
        throw ConfigError(command + ": q, k and v must be float32, float64, float16 or bfloat16 (int16/uint16 bits " +
                          "with --dtype bfloat16 or float16): " + describe("q", q_path, in.q));
    if (!allowed_mask_path.empty()) {
        const npy::Array m = npy::read_file(allowed_mask_path);
        if (m.dtype != npy::DType::Bool)
            throw ConfigError(command + ": the allowed mask must be bool (true = may attend): " +
                              describe("allowed_mask", allowed_mask_path, m));
        in.allowed_mask = npy::to_tensor<bool>(m, allowed_mask_path);
    }
    // The float inputs beside q, k and v: of their dtype.
    const auto read_like_q = [&](const char* name, const std::string& path, std::optional<npy::Array>& into) {
        if (path.empty()) return;
        into = read_float_file(path, dtype_option);
        if (into->dtype != d)
            throw ConfigError(command + ": " + name + " must have the dtype of q, k and v: " + describe(name, path, *into) +
                              ", " + describe("q", q_path, in.q));
    };
    read_like_q("bias", bias_path, in.bias);
    in.bias_path = bias_path;
    read_like_q("alibi_slopes", alibi_path, in.alibi_slopes);
    in.alibi_path = alibi_path;
    return in;
}

}  // namespace attn::cli
