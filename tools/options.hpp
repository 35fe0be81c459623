// tools/options.hpp: the attention options on the command line. Every flag's name, help and default comes from the
// library's option table (attn/options.hpp), the values' spellings from its spelling tables; the commands register
// the rows they take with add_attention_options and read them back with AttentionArgs::options.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <span>
#include <string_view>

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

    // The options these values spell, as O (SdpaOptions, MhaOptions) with O's own fields at their defaults (the bias
    // and the slopes are the caller's to set); ConfigError naming `function` for a value that does not parse.
    template <class O = AttentionOptions>
    O options(const std::string& function) const {
        O o;
        static_cast<AttentionOptions&>(o) = shared_options(function);
        return o;
    }
    AttentionOptions shared_options(const std::string& function) const;
};

// Registers the option table's rows `fields` (their OptionSpec::field) on `cmd`, bound to `args`: the flag, the
// help, the default and, for an enumeration, its spellings as the only values allowed. A field without a
// command-line flag, or one AttentionArgs does not hold, is a std::logic_error (a bug in the command, not input).
// Every command takes problem_option_fields; `attn sdpa` and `attn mha` add execution_option_fields.
void add_attention_options(CLI::App* cmd, AttentionArgs& args, std::span<const std::string_view> fields);

}  // namespace attn::cli
