// tools/options.hpp: the options every attention command shares, from their spellings on the command line and in
// the Python module (attn.sdpa(..., causal="top-left", empty_rows="zero")): one mapping for both.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"

namespace attn::cli {

// A sliding window from "LEFT,RIGHT" (-1 = unbounded; "" = none) and its alignment, "bottom-right" (FlashAttention's)
// or "top-left" (JAX's). ConfigError naming `function` when it does not parse; the sides' range is the library's check.
inline std::optional<SlidingWindow> window_from(const std::string& window, const std::string& alignment,
                                                const std::string& function = "attn") {
    if (alignment != "top-left" && alignment != "bottom-right")
        throw ConfigError(function + ": the window's alignment must be top-left or bottom-right, got '" + alignment +
                          "'");
    if (window.empty()) return std::nullopt;
    SlidingWindow w;
    w.alignment = alignment == "top-left" ? CausalAlignment::TopLeft : CausalAlignment::BottomRight;
    std::size_t used_left = 0, used_right = 0;
    const auto comma = window.find(',');
    try {
        if (comma == std::string::npos) throw std::invalid_argument("no comma");
        w.left = std::stoll(window.substr(0, comma), &used_left);
        w.right = std::stoll(window.substr(comma + 1), &used_right);
    } catch (const std::exception&) {
        used_left = 0;
    }
    if (used_left == 0 || used_left != comma || used_right == 0 || comma + 1 + used_right != window.size())
        throw ConfigError(function + ": the window must be LEFT,RIGHT (two integers, -1 = unbounded), got '" + window +
                          "'");
    return w;
}

// The options every attention command shares, from their command-line spellings: causal "", "top-left" or
// "bottom-right"; empty rows "throw", "zero" or "nan"; the window as window_from reads it (ConfigError naming
// `function` for anything else); the softcap as given.
inline SdpaOptions sdpa_options_from(std::optional<double> scale, const std::string& causal,
                                     const std::string& empty_rows, bool check_finite,
                                     const std::string& function = "attn", const std::string& window = "",
                                     const std::string& window_alignment = "bottom-right", double softcap = 0) {
    if (!causal.empty() && causal != "top-left" && causal != "bottom-right")
        throw ConfigError(function + ": causal must be top-left or bottom-right (or none), got '" + causal + "'");
    if (empty_rows != "throw" && empty_rows != "zero" && empty_rows != "nan")
        throw ConfigError(function + ": empty_rows must be throw, zero or nan, got '" + empty_rows + "'");
    SdpaOptions options;
    options.scale = scale;
    options.is_causal = !causal.empty();
    options.alignment = causal == "bottom-right" ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
    options.empty_rows = empty_rows == "zero" ? EmptyRowPolicy::Zero
                         : empty_rows == "nan" ? EmptyRowPolicy::Nan
                                               : EmptyRowPolicy::Throw;
    options.check_finite = check_finite;
    options.window = window_from(window, window_alignment, function);
    options.softcap = softcap;  // checked by the library and the oracle (attn::detail::check_softcap)
    return options;
}

// --softcap's help, for every command that takes it.
inline constexpr const char* softcap_help =
    "Logit soft-capping (Gemma 2, FlashAttention's softcap): each logit s becomes C tanh(s / C), after the scale and "
    "before the masks; 0 = off";

// --bias's help, for every command that takes it.
inline constexpr const char* bias_help =
    "Additive bias (PyTorch's float attn_mask): a .npy of q's dtype broadcastable to (..., Tq, Tk), added to each "
    "logit after the scale and the soft-capping; -inf blocks the key like false in the mask";

// --causal's, --window's and --window-alignment's help, for every command that takes them.
inline constexpr const char* causal_help = "Causal rule: top-left (j <= i) or bottom-right (j <= i + Tk - Tq)";
inline constexpr const char* window_help =
    "Sliding window LEFT,RIGHT (FlashAttention's window_size; -1 = unbounded): key j visible to query i iff "
    "i + d - LEFT <= j <= i + d + RIGHT, d = Tk - Tq (or 0 with --window-alignment top-left); and-ed with the mask "
    "and the causal rule";
inline constexpr const char* window_alignment_help =
    "bottom-right (FlashAttention's, d = Tk - Tq) or top-left (JAX's, d = 0)";

// --alibi-slopes's help, for every command that takes it.
inline constexpr const char* alibi_help =
    "ALiBi slopes (FlashAttention's alibi_slopes): a .npy of q's dtype broadcastable to the batch dims, (H) or (B, H); "
    "each logit gets -slope * |i + Tk - Tq - j|, added with the bias";

}  // namespace attn::cli
