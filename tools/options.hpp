// tools/options.hpp: the attention options on the command line. Every flag's name, help and default comes from the
// library's option table (attn/options.hpp), the values' spellings from its spelling tables; the commands register
// the rows they take with add_attention_options and read them back with AttentionArgs::options.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attn/options.hpp"

namespace attn::cli {

// A sliding window from "LEFT,RIGHT" (-1 = unbounded; "" = none) and its alignment (alignment_spellings).
// ConfigError naming `function` when it does not parse; the sides' range is the library's check.
std::optional<SlidingWindow> window_from(const std::string& window, const std::string& alignment,
                                         const std::string& function = "attn");

// The shared options as the command line gives them; the defaults are AttentionOptions'.
struct AttentionArgs {
    std::optional<double> scale;
    std::string causal;  // "" (none) or an alignment's spelling
    std::string window, window_alignment = to_string(SlidingWindow{}.alignment);
    double softcap = AttentionOptions{}.softcap;
    std::string bias_path, alibi_path;  // .npy files, read in the inputs' dtype (attention_inputs.hpp)
    std::string empty_rows = to_string(AttentionOptions{}.empty_rows);
    bool no_check_finite = !AttentionOptions{}.check_finite;
    std::string backend = to_string(AttentionOptions{}.backend);
    int num_threads = AttentionOptions{}.num_threads;

    // The options these values spell (the bias and the slopes are the caller's to set); ConfigError naming
    // `function` for a value that does not parse.
    AttentionOptions options(const std::string& function) const;
};

// Registers the option table's rows `fields` (their OptionSpec::field) on `cmd`, bound to `args`: the flag, the
// help, the default and, for an enumeration, its spellings as the only values allowed. A field without a
// command-line flag, or one AttentionArgs does not hold, is a std::logic_error (a bug in the command, not input).
void add_attention_options(CLI::App* cmd, AttentionArgs& args, const std::vector<std::string_view>& fields);

// The fields every attention command takes: the problem (scale, causal rule, window, softcap, bias, slopes, empty
// rows, finite checks); `attn sdpa` and `attn mha` add the library's backend and threads.
inline const std::vector<std::string_view> problem_fields = {
    "bias", "alibi_slopes", "is_causal", "window", "window.alignment", "scale", "softcap", "empty_rows",
    "check_finite"};

}  // namespace attn::cli
