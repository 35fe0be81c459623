// The attention options on the command line, from the library's option table.
#include "options.hpp"

#include <stdexcept>

namespace attn::cli {

std::optional<SlidingWindow> window_from(const std::string& window, const std::string& alignment,
                                         const std::string& function) {
    const CausalAlignment side = parse_spelling<CausalAlignment>(alignment, function, "the window's alignment");
    if (window.empty()) return std::nullopt;
    SlidingWindow w;
    w.alignment = side;
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

AttentionOptions AttentionArgs::shared_options(const std::string& function) const {
    AttentionOptions o;
    o.scale = scale;
    o.is_causal = !causal.empty();
    if (o.is_causal) o.alignment = parse_spelling<CausalAlignment>(causal, function, "causal");
    o.window = window_from(window, window_alignment, function);
    o.softcap = softcap;  // checked by the library and the oracle (attn::detail::check_softcap)
    o.empty_rows = parse_spelling<EmptyRowPolicy>(empty_rows, function, "empty_rows");
    o.check_finite = !no_check_finite;
    o.backend = parse_spelling<Backend>(backend, function, "backend");
    o.num_threads = num_threads;
    return o;
}

namespace {

// The option bound to `value`, with the row's flag and help; an enumeration's spellings are its only values.
template <class Value>
CLI::Option* add(CLI::App* cmd, const OptionSpec& o, Value& value) {
    return cmd->add_option(o.cli, value, o.help);
}

template <class E>
CLI::Option* add_spelt(CLI::App* cmd, const OptionSpec& o, std::string& value) {
    return cmd->add_option(o.cli, value, o.help)->check(CLI::IsMember(spelling_names<E>()));
}

}  // namespace

void add_attention_options(CLI::App* cmd, AttentionArgs& args, std::span<const std::string_view> fields) {
    for (const std::string_view field : fields) {
        const OptionSpec& o = option_spec(field);
        if (*o.cli == '\0') throw std::logic_error("add_attention_options: " + std::string(field) + " has no flag");
        if (field == "scale") add(cmd, o, args.scale);
        else if (field == "is_causal") add_spelt<CausalAlignment>(cmd, o, args.causal);
        else if (field == "window") add(cmd, o, args.window);
        else if (field == "window.alignment") add_spelt<CausalAlignment>(cmd, o, args.window_alignment)->capture_default_str();
        else if (field == "softcap") add(cmd, o, args.softcap)->capture_default_str();
        else if (field == "bias") add(cmd, o, args.bias_path);
        else if (field == "alibi_slopes") add(cmd, o, args.alibi_path);
        else if (field == "empty_rows") add_spelt<EmptyRowPolicy>(cmd, o, args.empty_rows)->capture_default_str();
        else if (field == "check_finite") cmd->add_flag(o.cli, args.no_check_finite, o.help);
        else if (field == "backend") add_spelt<Backend>(cmd, o, args.backend)->capture_default_str();
        else if (field == "num_threads") add(cmd, o, args.num_threads)->capture_default_str()->check(CLI::NonNegativeNumber);
        else throw std::logic_error("add_attention_options: AttentionArgs holds no " + std::string(field));
    }
}

}  // namespace attn::cli
