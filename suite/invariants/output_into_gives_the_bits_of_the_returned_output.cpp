// scaled_dot_product_attention_into (the caller's output tensor, no allocation) is the same computation as
// scaled_dot_product_attention: into a tensor that held NaN before, it writes bitwise the output the other call
// returns, or both calls refuse the case. And it refuses what only it can get wrong: an output that overlaps an input
// (written while the input is read; q, k, v, the bias or the slopes, by all of it or by one element, while an output
// just before an input is accepted; the input also stored backwards and read through negative strides), an output of
// another shape, and a request for the weights or the lse (which it
// has nowhere to put); the tiled backend refuses a request for the weights of the returned call too (it never forms
// them). Without this property the call that `attn bench` times would be checked by unit tests only.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "../checks.hpp"

namespace attn::suite {

Property output_into_gives_the_bits_of_the_returned_output() {
    Property p;
    p.name = "output_into_gives_the_bits_of_the_returned_output";
    p.sentence = "scaled_dot_product_attention_into writes into the caller's tensor, whatever it held, bitwise the output "
                 "scaled_dot_product_attention returns, and refuses an output that overlaps an input or has another "
                 "shape, and a request for the weights or the lse; backend tiled refuses to return the weights.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.name == "reference" || impl.name == "tiled"; };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        SdpaOptions o = c.options;
        o.backend = impl.name == "reference" ? Backend::Reference : Backend::Tiled;
        o.return_weights = o.return_lse = false;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            CaseInputs<T> in = make_inputs<T>(c);
            const SdpaOptions options = in.with_bias(o);
            const std::string what = std::string("into vs returned, backend ") + to_string(o.backend);
            std::optional<SdpaResult<T>> returned;
            const std::string returned_error = thrown_message(
                [&] { returned = scaled_dot_product_attention(in.q_view, in.k_view, in.v_view, in.allowed_view, options); });
            const Shape shape = returned ? returned->output.shape() : Shape{c.B, c.H, c.Tq, c.Dv};
            Tensor<T> out(shape, static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
            // The call into `target` with `opts`, to make.
            const auto call = [&](TensorView<T> target, const SdpaOptions& opts) {
                return [&in, target, opts] {
                    scaled_dot_product_attention_into(target, in.q_view, in.k_view, in.v_view, in.allowed_view, opts);
                };
            };
            const std::string into_error = thrown_message(call(out.view(), options));
            if (returned_error.empty() != into_error.empty())
                return what + ": " + (into_error.empty() ? "into accepted the case the other call refused: " + returned_error
                                                          : "into refused the case the other call accepted: " + into_error);
            if (!returned) return std::nullopt;  // both refused it
            if (Verdict v = bitwise_equal(c, out, returned->output, what)) return v;

            // One refusal per case, drawn, each of its kind and naming what is wrong.
            switch (rng.below(4)) {
            case 3: {
                // The weights asked of the returned call: backend tiled never forms them and refuses; reference
                // returns them beside the same output.
                SdpaOptions asks = options;
                asks.return_weights = true;
                const auto with_weights = [&] {
                    return scaled_dot_product_attention(in.q_view, in.k_view, in.v_view, in.allowed_view, asks);
                };
                if (o.backend == Backend::Tiled)
                    return refused_with(with_weights, "backend tiled asked for the weights", "ConfigError",
                                        "never forms the (Tq, Tk) weights");
                return bitwise_equal(c, with_weights().output, returned->output, what + ", weights asked");
            }
            case 0: {
                SdpaOptions asks = options;
                (rng.below(2) == 0 ? asks.return_weights : asks.return_lse) = true;
                return refused_with(call(out.view(), asks), "into asked for the weights or the lse", "ConfigError",
                                    "writes the output only");
            }
            case 1: {
                Shape other = shape;
                other.back() += 1;
                Tensor<T> wrong(other);
                return refused_with(call(wrong.view(), options), "into an output of shape " + to_string(other),
                                    "ShapeError", "out must have the output's shape");
            }
            default: {
                // The output against an input's storage (drawn: q, k, v, or the bias or the slopes where the case
                // has them, one of those half the time): laid over its start, or at the edge of a buffer holding a
                // copy of the input right after it, sharing one element (refused) or none (accepted, with the
                // returned output's bits).
                // Each input: its name, its view, its storage, and where the call takes it.
                enum class Slot { Q, K, V, Bias, Slopes };
                struct Input {
                    std::string name;
                    TensorView<const T> view;
                    Tensor<T>* storage;
                    Slot slot;
                };
                std::vector<Input> inputs = {{"q", in.q_view, &in.q, Slot::Q},
                                             {"k", in.k_view, &in.k, Slot::K},
                                             {"v", in.v_view, &in.v, Slot::V}};
                if (in.bias_view) inputs.push_back({"the bias", *in.bias_view, &*in.bias_storage, Slot::Bias});
                if (in.alibi_view) inputs.push_back({"the ALiBi slopes", *in.alibi_view, &*in.alibi_storage, Slot::Slopes});
                const std::size_t extra = inputs.size() - 3;
                const Input& chosen = inputs[extra > 0 && rng.below(2) == 0 ? 3 + rng.below(extra) : rng.below(3)];
                const std::string& name = chosen.name;
                if (out.numel() == 0) return std::nullopt;
                if (rng.below(2) == 0) {
                    Tensor<T>& storage = *chosen.storage;
                    if (out.numel() > storage.numel()) return std::nullopt;
                    return refused_with(call(TensorView<T>(storage.data(), shape), options),
                                        "into an output over " + name + "'s storage", "ConfigError",
                                        "out overlaps an input");
                }
                const Tensor<T> dense = Tensor<T>::copy_of(chosen.view);
                const bool touching = rng.below(2) == 0;
                const Index offset = out.numel() - (touching ? 1 : 0), n = dense.numel();
                Tensor<T> buffer({offset + n}, static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
                // Stored in order, or backwards and read through negative strides (NumPy's x[::-1, ::-1]): the
                // view's pointer is then its storage's last element, and its lowest address is the buffer's.
                const bool backwards = rng.below(2) == 0 && n > 0;
                TensorView<const T> placed(buffer.data() + offset, dense.shape());
                if (backwards) {
                    std::reverse_copy(dense.data(), dense.data() + n, buffer.data() + offset);
                    Shape strides = contiguous_strides(dense.shape());
                    for (Index& s : strides) s = -s;
                    placed = TensorView<const T>(buffer.data() + offset + n - 1, dense.shape(), strides);
                } else {
                    std::copy_n(dense.data(), n, buffer.data() + offset);
                }
                TensorView<const T> views[3] = {in.q_view, in.k_view, in.v_view};
                SdpaOptions placed_options = options;
                switch (chosen.slot) {
                    case Slot::Bias: placed_options.bias = placed; break;
                    case Slot::Slopes: placed_options.alibi_slopes = placed; break;
                    default: views[static_cast<int>(chosen.slot)] = placed;
                }
                const TensorView<T> target(buffer.data(), shape);
                const auto into = [&] {
                    scaled_dot_product_attention_into(target, views[0], views[1], views[2], in.allowed_view, placed_options);
                };
                const std::string where = std::string("into an output ") +
                                          (touching ? "whose last element is the first of " : "just before ") + name +
                                          (backwards ? " (stored backwards, negative strides)" : "");
                if (touching) return refused_with(into, where, "ConfigError", "out overlaps an input");
                const std::string error = thrown_message(into);
                if (!error.empty()) return what + ": " + where + " was refused: " + error;
                return bitwise_equal(c, Tensor<T>::copy_of(TensorView<const T>(buffer.data(), shape)), returned->output,
                                     what + ", " + where);
            }
            }
        });
    };
    return p;
}

}  // namespace attn::suite
