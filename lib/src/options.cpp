// The option table, the spellings' lookups, the default scale and the remedies in each interface's terms.
#include "attn/options.hpp"

#include <cmath>
#include <stdexcept>

namespace attn {

namespace {

template <class E>
const char* name_of(E value) {
    for (const Spelling<E>& s : spellings(E{}))
        if (s.value == value) return s.name;
    return "?";
}

// The C++ spelling of a value named in a remedy: an enumerator's ("EmptyRowPolicy::Zero"), or the name itself
// ("false").
std::string cpp_value(const std::string& name) {
    for (const auto& s : empty_row_spellings)
        if (name == s.name) return s.cpp;
    for (const auto& s : backend_spellings)
        if (name == s.name) return s.cpp;
    for (const auto& s : alignment_spellings)
        if (name == s.name) return s.cpp;
    return name;
}

std::string python_value(const std::string& name) {
    if (name == "true") return "True";
    if (name == "false") return "False";
    return "'" + name + "'";
}

constexpr OptionSpec kTable[] = {
    {"scale", "--scale", "scale", "scale", "1/sqrt(Dk)", "Logit scale (default 1/sqrt(Dk), Dk the query/key width)"},
    {"is_causal", "--causal", "causal", "", "none",
     "Causal rule, and its alignment: top-left (j <= i) or bottom-right (j <= i + Tk - Tq)"},
    {"window", "--window", "window", "window", "none",
     "Sliding window LEFT,RIGHT (FlashAttention's window_size; -1 = unbounded): key j visible to query i iff "
     "i + d - LEFT <= j <= i + d + RIGHT, d = Tk - Tq (or 0 with the top-left window alignment); and-ed with the "
     "mask and the causal rule"},
    {"window.alignment", "--window-alignment", "window_alignment", "", "bottom-right",
     "The window's alignment: bottom-right (FlashAttention's, d = Tk - Tq) or top-left (JAX's, d = 0)"},
    {"softcap", "--softcap", "softcap", "softcap", "0",
     "Logit soft-capping (Gemma 2, FlashAttention's softcap): each logit s becomes C tanh(s / C), after the scale "
     "and before the masks; 0 = off"},
    {"bias", "--bias", "bias", "bias", "none",
     "Additive bias (PyTorch's float attn_mask), of q's dtype, in the allowed mask's shapes: added to each logit "
     "after the scale and the soft-capping; -inf blocks the key like false in the mask"},
    {"alibi_slopes", "--alibi-slopes", "alibi_slopes", "alibi", "none",
     "ALiBi slopes (FlashAttention's alibi_slopes), of q's dtype, broadcastable to the batch dims, (H) or (B, H): "
     "each logit gets -slope * |i + Tk - Tq - j|, added with the bias"},
    {"empty_rows", "--empty-rows", "empty_rows", "empty_rows", "throw",
     "Rows with no allowed key: throw (error), zero or nan"},
    {"check_finite", "--no-check-finite", "check_finite", "check_finite", "on",
     "Reject NaN/Inf at positions some query reads (a ValueError); off (--no-check-finite, check_finite=False), "
     "they propagate to the rows that read them",
     true},
    {"backend", "--backend", "backend", "", "auto",
     "reference, tiled or auto (tiled when Tq * Tk >= 128 * 128 and no weights are asked for)"},
    {"num_threads", "--threads", "num_threads", "threads", "0",
     "Threads (0: OpenMP's default); the result does not depend on it"},
    {"tiled_query_block", "", "", "", "0", "Backend tiled: query rows per task (0: the kernel's)"},
    {"tiled_key_block", "", "", "", "0", "Backend tiled: keys per online-softmax step (0: the kernel's)"},
    // SdpaOptions' own.
    {"return_weights", "--weights", "return_weights", "", "false",
     "Also return the weights (..., Tq, Tk) (backend reference or auto)"},
    {"return_lse", "", "return_lse", "", "false",
     "Also return each query row's log-sum-exp (..., Tq), in the compute type (what the backward reads)"},
    // MhaOptions' own.
    {"key_padding_allowed", "", "", "", "none", "Bool (B, Tk): true = a real key, false = padding"},
    {"key_padding_bias", "--key-padding-bias", "", "", "none",
     "Float (B, Tk) of the inputs' dtype (nn.MultiheadAttention's float key_padding_mask), added to every query's "
     "logits; with a bias the two are summed first, in the dtype, as PyTorch does"},
    {"weights", "--weights", "", "", "none", "Also return the weights, per head (B, H, Tq, Tk) or their head average"},
    {"training", "", "", "", "false", "Apply MhaConfig::dropout"},
    {"dropout_step", "", "", "", "0", "Mixed into the dropout stream: a training loop's step, for a fresh mask"},
};

}  // namespace

const char* to_string(EmptyRowPolicy policy) { return name_of(policy); }
const char* to_string(Backend backend) { return name_of(backend); }
const char* to_string(CausalAlignment alignment) { return name_of(alignment); }  // declared in attn/mask.hpp

double default_scale(Index Dk) { return Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(Dk)) : 1.0; }

std::span<const OptionSpec> option_table() { return kTable; }

const OptionSpec& option_spec(std::string_view field) {
    for (const OptionSpec& o : kTable)
        if (field == o.field) return o;
    throw std::logic_error("attn::option_spec: no option '" + std::string(field) + "' in the table");
}

std::string remedy_text(const Remedy& remedy, Interface interface) {
    const OptionSpec& o = option_spec(remedy.field);
    std::string s = interface == Interface::Cpp ? "set options." + remedy.field + " to " : "pass ";
    for (std::size_t i = 0; i < remedy.values.size(); ++i) {
        const std::string& v = remedy.values[i];
        s += i == 0 ? "" : " or ";
        switch (interface) {
            case Interface::Cpp: s += cpp_value(v); break;
            case Interface::Cli: s += o.cli_negates ? std::string(o.cli) : std::string(o.cli) + " " + v; break;
            case Interface::Python: s += std::string(o.python) + "=" + python_value(v); break;
        }
    }
    return s + " " + remedy.purpose;
}

Error::Error(const std::string& problem, Remedy remedy)
    : std::runtime_error(problem + "; " + remedy_text(remedy, Interface::Cpp)),
      parts_(std::make_shared<const Parts>(Parts{problem, std::move(remedy)})) {}

std::string Error::message(Interface interface) const {
    if (!parts_ || interface == Interface::Cpp) return what();
    return parts_->problem + "; " + remedy_text(parts_->remedy, interface);
}

}  // namespace attn
