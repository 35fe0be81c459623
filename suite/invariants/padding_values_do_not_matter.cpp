// Invariant 7: values at key/value positions no query may read (padding), NaN and Inf included, do not change
// the output, bitwise. On the library's paths, one case in two also says it with the blocking written as a -inf
// bias in column-major (Tq, Tk) matrices instead of the mask and position rules: a key that only a -inf bias blocks
// is just as unread (its NaN is no error), whatever the bias's layout.
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

namespace {

// unreadable[(b * kv_heads + g) * Tk + j]: no query of any head reading K/V head g of batch b may read key j.
std::vector<char> unreadable_keys(const SdpaCase& c) {
    const Tensor<bool> allowed = expanded_allowed(c);
    std::vector<char> r(static_cast<std::size_t>(c.B * c.kv_heads * c.Tk), 1);
    const Index group = c.H / c.kv_heads;
    for (Index b = 0; b < c.B; ++b)
        for (Index h = 0; h < c.H; ++h)
            for (Index i = 0; i < c.Tq; ++i)
                for (Index j = 0; j < c.Tk; ++j)
                    if (allowed[((b * c.H + h) * c.Tq + i) * c.Tk + j])
                        r[static_cast<std::size_t>((b * c.kv_heads + h / group) * c.Tk + j)] = 0;
    return r;
}

}  // namespace

Property padding_values_do_not_matter() {
    Property p;
    p.name = "padding_values_do_not_matter";
    p.sentence = "Values at key and value positions that no query may read, NaN and Inf included, do not change a bit "
                 "of the output.";
    // The case carries special values (suite generator: NaN, Inf, subnormals, huge, -0, ...) at every unreadable
    // position; the check compares it with the same case holding zeros there.
    p.generator = [](Dtype d) {
        return rc::gen::exec([d] {
            SdpaCase c = *gen::sdpa_case(d, {.masks = gen::Masks::UnreadableKeys, .bias = true});
            const std::vector<char> unreadable = unreadable_keys(c);
            const rc::Gen<double> garbage = gen::special_value(d);
            for (Index r = 0; r < c.B * c.kv_heads * c.Tk; ++r)
                if (unreadable[static_cast<std::size_t>(r)]) {
                    for (Index x = 0; x < c.Dk; ++x) c.k[r * c.Dk + x] = *garbage;
                    for (Index x = 0; x < c.Dv; ++x) c.v[r * c.Dv + x] = *garbage;
                }
            c.distribution += "+garbage";
            return c;
        });
    };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const std::vector<char> unreadable = unreadable_keys(c);
        SdpaCase clean = c;
        Index garbage_rows = 0;
        for (Index r = 0; r < c.B * c.kv_heads * c.Tk; ++r)
            if (unreadable[static_cast<std::size_t>(r)]) {
                ++garbage_rows;
                for (Index x = 0; x < c.Dk; ++x) clean.k[r * c.Dk + x] = 0;
                for (Index x = 0; x < c.Dv; ++x) clean.v[r * c.Dv + x] = 0;
            }
        if (garbage_rows == 0) return "generator error: the case has no unreadable key position";
        const std::string what = "garbage vs zeros at " + std::to_string(garbage_rows) + " unreadable key rows";
        Rng rng(c.aux_seed);
        const bool as_bias = is_library_path(impl) && rng.below(2) == 0;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> expected = run_impl<T>(impl, clean);
            if (Verdict v = bitwise_equal(c, run_impl<T>(impl, c), expected, what)) return v;
            if (!as_bias) return std::nullopt;
            // The blocking as a -inf bias (added to the case's own), passed transposed: key stride Tq, not 1.
            const SdpaCase biased = with_blocking_as_bias(c);
            const CaseInputs<T> in = make_inputs<T>(biased);
            std::vector<T> storage;
            SdpaOptions transposed = in.with_bias(biased.options);
            transposed.bias = relaid(*in.bias_view, 2, storage);
            std::optional<SdpaResult<T>> r;
            const std::string error = thrown_message([&] { r = impl.run<T>(in.q_view, in.k_view, in.v_view, std::nullopt, transposed); });
            if (!error.empty()) return what + ", the blocking as a transposed -inf bias: refused: " + error;
            // (B, H, Tq, Dv), as run_impl gives it: the grouped-query layout's output has the same memory order.
            return bitwise_equal(c, Tensor<T>(r->output).reshaped(expected.shape()), expected,
                                 what + ", the blocking as a transposed -inf bias");
        });
    };
    return p;
}

}  // namespace attn::suite
