// tools/options.hpp: the options every attention command shares, from their spellings on the command line and in
// the Python module (attn.sdpa(..., causal="top-left", empty_rows="zero")): one mapping for both.
#pragma once

#include <optional>
#include <string>

#include "attn/error.hpp"
#include "attn/sdpa.hpp"

namespace attn::cli {

// The options every attention command shares, from their command-line spellings: causal "", "top-left" or
// "bottom-right"; empty rows "throw", "zero" or "nan" (ConfigError naming `function` for anything else).
inline SdpaOptions sdpa_options_from(std::optional<double> scale, const std::string& causal,
                                     const std::string& empty_rows, bool check_finite,
                                     const std::string& function = "attn") {
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
    return options;
}

}  // namespace attn::cli
