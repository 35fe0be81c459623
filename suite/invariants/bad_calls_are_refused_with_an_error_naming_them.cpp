// Invariant: a call the contract refuses throws the error of its kind, and the message names what is wrong, never a
// crash, a silent NaN or a result. One corruption per case, drawn from: k's Dk unlike q's, v's Tk unlike k's, a
// negative thread count, a NaN scale, a scale below the dtype's normal range (its rounding would not be relative),
// a negative tiled block size, a NaN where a query reads. No mutant breaks a contract check (they share the driver's validation); this guards the
// contract module's rejections, which no other property calls.
#include <cmath>
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

namespace {

enum class Corruption { DkMismatch, TkMismatch, NegativeThreads, NanScale, SubnormalScale, NegativeBlock, NanRead, Count };

const char* to_string(Corruption c) {
    switch (c) {
        case Corruption::DkMismatch: return "k's Dk unlike q's";
        case Corruption::TkMismatch: return "v's Tk unlike k's";
        case Corruption::NegativeThreads: return "num_threads = -1";
        case Corruption::NanScale: return "scale = NaN";
        case Corruption::SubnormalScale: return "a scale below the normal range";
        case Corruption::NegativeBlock: return "tiled_key_block = -1";
        case Corruption::NanRead: return "a NaN in q, which its row reads";
        case Corruption::Count: break;
    }
    return "?";
}

}  // namespace

Property bad_calls_are_refused_with_an_error_naming_them() {
    Property p;
    p.name = "bad_calls_are_refused_with_an_error_naming_them";
    p.sentence = "A call with mismatched shapes, a negative thread count, a NaN or subnormal scale, a negative tiled "
                 "block size, or a NaN where a query reads is refused with the error of its kind (ShapeError, ConfigError, ValueError) and a "
                 "message naming the offending dimension, option or tensor.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::None}); };
    p.breadth = 4;  // many refusals, one per case, each cheap
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        const auto kind = static_cast<Corruption>(rng.below(static_cast<std::uint64_t>(Corruption::Count)));
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Index B = c.B, H = c.H, Tq = c.Tq, Tk = c.Tk, Dk = c.Dk, Dv = c.Dv;
            Tensor<T> q = normal_tensor<T>({B, H, Tq, Dk}, rng);
            const Tensor<T> k = normal_tensor<T>({B, H, Tk, kind == Corruption::DkMismatch ? Dk + 1 : Dk}, rng);
            const Tensor<T> v = normal_tensor<T>({B, H, kind == Corruption::TkMismatch ? Tk + 1 : Tk, Dv}, rng);
            SdpaOptions options;
            const char *expected_kind = "", *keyword = "";
            switch (kind) {
                case Corruption::DkMismatch: expected_kind = "ShapeError", keyword = "Dk"; break;
                case Corruption::TkMismatch: expected_kind = "ShapeError", keyword = "Tk"; break;
                case Corruption::NegativeThreads:
                    options.num_threads = -1, expected_kind = "ConfigError", keyword = "num_threads";
                    break;
                case Corruption::NanScale:
                    options.scale = std::numeric_limits<double>::quiet_NaN(), expected_kind = "ConfigError",
                    keyword = "scale";
                    break;
                case Corruption::SubnormalScale:
                    options.scale = static_cast<double>(std::numeric_limits<compute_t<T>>::denorm_min()) * 3,
                    expected_kind = "ConfigError",
                    keyword = std::is_same_v<T, double> ? "below the normal range of double" : "below the normal range of float";
                    break;
                case Corruption::NegativeBlock:
                    options.tiled_key_block = -1, expected_kind = "ConfigError", keyword = "tiled_key_block";
                    break;
                case Corruption::NanRead:
                    q[static_cast<Index>(rng.below(static_cast<std::uint64_t>(q.numel())))] =
                        std::numeric_limits<T>::quiet_NaN();
                    expected_kind = "ValueError", keyword = "holds nan";
                    break;
                case Corruption::Count: break;
            }
            return refused_with([&] { impl.run<T>(q.view(), k.view(), v.view(), std::nullopt, options); },
                                to_string(kind), expected_kind, keyword);
        });
    };
    return p;
}

}  // namespace attn::suite
