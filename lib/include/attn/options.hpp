// attn/options.hpp: the options of an attention call, written once. AttentionOptions holds the fields SDPA and MHA
// share (SdpaOptions and MhaOptions derive from it); the default scale rule; the spellings of the enumerations; and
// the option table, every option's name in C++, on the command line, in Python and in config strings, with its
// default and its help. The tools, the Python module, the suite and the oracle read names, spellings and defaults
// from here. Adding an option: a field here (or in SdpaOptions / MhaOptions), a row in option_table, the kernel, the
// oracle and its property.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "attn/error.hpp"
#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"

namespace attn {

// What a query row with no allowed key produces.
enum class EmptyRowPolicy {
    Throw,  // default: MaskError naming the first offending batch index and query row
    Zero,   // output row and weights row are 0
    Nan,    // output row and weights row are NaN (PyTorch's math path)
};

enum class Backend {
    Auto,       // the library picks: tiled when Tq * Tk >= 128 * 128 and no weights are asked for, else reference
    Reference,  // materialises scores per (batch, head) with BLIS gemm; clear before fast
    Tiled,      // online softmax over key blocks, never a Tq x Tk matrix (return_weights: reference runs instead)
};

// One spelling of an enumerator: `name` on the command line, in Python and in config strings, `cpp` in C++.
template <class E>
struct Spelling {
    E value;
    const char* name;
    const char* cpp;
};

inline constexpr Spelling<EmptyRowPolicy> empty_row_spellings[] = {
    {EmptyRowPolicy::Throw, "throw", "EmptyRowPolicy::Throw"},
    {EmptyRowPolicy::Zero, "zero", "EmptyRowPolicy::Zero"},
    {EmptyRowPolicy::Nan, "nan", "EmptyRowPolicy::Nan"},
};
inline constexpr Spelling<Backend> backend_spellings[] = {
    {Backend::Auto, "auto", "Backend::Auto"},
    {Backend::Reference, "reference", "Backend::Reference"},
    {Backend::Tiled, "tiled", "Backend::Tiled"},
};
inline constexpr Spelling<CausalAlignment> alignment_spellings[] = {
    {CausalAlignment::TopLeft, "top-left", "CausalAlignment::TopLeft"},
    {CausalAlignment::BottomRight, "bottom-right", "CausalAlignment::BottomRight"},
};

inline std::span<const Spelling<EmptyRowPolicy>> spellings(EmptyRowPolicy) { return empty_row_spellings; }
inline std::span<const Spelling<Backend>> spellings(Backend) { return backend_spellings; }
inline std::span<const Spelling<CausalAlignment>> spellings(CausalAlignment) { return alignment_spellings; }

const char* to_string(EmptyRowPolicy policy);  // "throw", "zero", "nan"
const char* to_string(Backend backend);        // "auto", "reference", "tiled"

// Every spelling of E, in the table's order ("throw", "zero", "nan").
template <class E>
std::vector<std::string> spelling_names() {
    std::vector<std::string> names;
    for (const Spelling<E>& s : spellings(E{})) names.emplace_back(s.name);
    return names;
}

// "a, b or c": the spellings of E, for messages and help texts.
template <class E>
std::string spelling_list() {
    std::string s;
    const auto all = spellings(E{});
    for (std::size_t i = 0; i < all.size(); ++i)
        s += std::string(i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") + all[i].name;
    return s;
}

// The enumerator spelt `text`; ConfigError "<function>: <option> must be a, b or c, got 'x'" otherwise.
template <class E>
E parse_spelling(std::string_view text, const std::string& function, const std::string& option) {
    for (const Spelling<E>& s : spellings(E{}))
        if (text == s.name) return s.value;
    throw ConfigError(function + ": " + option + " must be " + spelling_list<E>() + ", got '" + std::string(text) +
                      "'");
}

// A view of a float tensor of any of the four dtypes, for the options that take a tensor (AttentionOptions::bias,
// AttentionOptions::alibi_slopes), which must have the inputs' dtype. It holds no data: the tensor must outlive the
// call.
class FloatView {
public:
    using View = std::variant<TensorView<const float>, TensorView<const double>, TensorView<const float16>,
                              TensorView<const bfloat16>>;
    template <class T>
    FloatView(TensorView<T> view) : view_(TensorView<const std::remove_const_t<T>>(view)) {}
    template <class T>
    FloatView(const Tensor<T>& tensor) : view_(tensor.view()) {}
    template <class T>
    FloatView(Tensor<T>&&) = delete;  // a temporary tensor would be gone before the call reads it

    const View& view() const { return view_; }
    // The view when its dtype is T, else nullptr.
    template <class T>
    const TensorView<const T>* get() const { return std::get_if<TensorView<const T>>(&view_); }
    Shape shape() const;
    const char* dtype_name() const;  // "float32", "float64", "float16", "bfloat16"

private:
    View view_;
};

// The options scaled_dot_product_attention (SdpaOptions) and the MHA module (MhaOptions) share, with one meaning in
// both: the MHA module hands them to its SDPA core as they are (bias and slopes after its own broadcasting).
struct AttentionOptions {
    std::optional<double> scale;  // default_scale(Dk): 1/sqrt(Dk), Dk the query/key width (MHA: head_dim)
    bool is_causal = false;       // and-ed with the masks when both are given
    CausalAlignment alignment = CausalAlignment::TopLeft;
    // Sliding window (attn/mask.hpp, SlidingWindow: FlashAttention's window_size, either alignment), and-ed with the
    // causal rule and the masks. Backend tiled never computes the key blocks a window excludes: the cost of a
    // window of width w grows like Tq w, not Tq Tk.
    std::optional<SlidingWindow> window;
    // Logit soft-capping (Gemma 2, FlashAttention's softcap): every logit s = scale * q.k becomes
    // softcap * tanh(s / softcap), after the scaling and before any mask (a blocked key stays blocked: weight exactly
    // 0). 0 = off. It must be 0 or finite and, in the type the logits are computed in, at least its smallest normal
    // number: ConfigError otherwise.
    double softcap = 0;
    // Additive bias (PyTorch's float attn_mask), of the inputs' dtype: added to every logit after the scaling and the
    // soft-capping, before the masks: s' = softcap * tanh(s / softcap) + bias (or s + bias without a cap). Its shapes
    // are the call's: SDPA's broadcastable to (batch..., Tq, Tk), MHA's those of its masks (MhaOptions). A -inf
    // entry blocks its key exactly like a false in the allowed mask (weight exactly 0; a row blocked everywhere is
    // an empty row); both may be given. Every other entry a query reads must be finite (ValueError under
    // check_finite). Another dtype is a ConfigError, a shape that does not broadcast a ShapeError.
    std::optional<FloatView> bias;
    // ALiBi (FlashAttention's alibi_slopes): slopes of the inputs' dtype broadcastable to the batch shape ((H) or
    // (B, H) for q (B, H, Tq, Dk)); the logit of query i and key j gets -slope * |i + Tk - Tq - j| (bottom-right
    // aligned, whatever `alignment` says), added with the bias. attn::alibi_slopes gives the standard slopes. A slope
    // must be finite and small enough that no such term overflows (ValueError otherwise); a shape that does not
    // broadcast is a ShapeError.
    std::optional<FloatView> alibi_slopes;
    EmptyRowPolicy empty_rows = EmptyRowPolicy::Throw;
    bool check_finite = true;  // ValueError on a NaN/Inf at a position some query reads
    Backend backend = Backend::Auto;
    int num_threads = 0;  // 0: OpenMP's default; the result is bitwise the same for any count
    // Backend tiled only: query rows per task and keys per online-softmax step (0: attn::tiled_kernel_info's). Small
    // blocks make every step between blocks happen at sizes a test can afford; oracle::library_tiled_model(key_block)
    // is the matching error model.
    Index tiled_query_block = 0, tiled_key_block = 0;
};

// The default scale, 1/sqrt(Dk) (1 when Dk = 0, where no logit exists), and the scale a call uses.
double default_scale(Index Dk);
inline double resolved_scale(const std::optional<double>& scale, Index Dk) {
    return scale ? *scale : default_scale(Dk);
}

// One row of the option table: an option's names in each interface ("" where the interface has none), its
// default as a user reads it, and its help.
struct OptionSpec {
    const char* field;   // the member of AttentionOptions, SdpaOptions or MhaOptions (C++)
    const char* cli;     // the attn commands' flag
    const char* python;  // the Python module's keyword
    const char* config;  // the key in a config string (the suite's cases, the report's rows)
    const char* default_text;
    const char* help;
    // The command-line flag says "false" (--no-check-finite); a value of the field has no other spelling there.
    bool cli_negates = false;
};

// The fields every attention entry point takes (the problem: what the oracle's answer depends on), and those only
// the library's own calls add (how it runs), by OptionSpec::field.
inline constexpr std::string_view problem_option_fields[] = {
    "bias", "alibi_slopes", "is_causal", "window", "window.alignment", "scale", "softcap", "empty_rows",
    "check_finite"};
inline constexpr std::string_view execution_option_fields[] = {"backend", "num_threads"};

// The table, in the order the commands list them.
std::span<const OptionSpec> option_table();
// The row of `field`; std::logic_error when the table has none (a misspelt field in the code is a bug, not input).
const OptionSpec& option_spec(std::string_view field);

// A remedy (attn/error.hpp) in an interface's terms: "set options.empty_rows to EmptyRowPolicy::Zero or
// EmptyRowPolicy::Nan to allow empty rows", "pass --empty-rows zero or --empty-rows nan to allow empty rows",
// "pass empty_rows='zero' or empty_rows='nan' to allow empty rows".
std::string remedy_text(const Remedy& remedy, Interface interface);

}  // namespace attn
