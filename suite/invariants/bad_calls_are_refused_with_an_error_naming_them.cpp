// Invariant: a call the contract refuses throws the error of its kind, and the message names what is wrong, never a
// crash, a silent NaN or a result. One corruption per case, drawn from: k's Dk unlike q's, v's Tk unlike k's, a
// negative thread count, a NaN scale, a scale below the dtype's normal range (its rounding would not be relative),
// a negative tiled block size, a NaN where a query reads, a q of rank 1, batch shapes that do not broadcast, a mask
// of more dims than the scores or of a shape that does not broadcast to them, a window side below -1, a bias of another dtype, of more dims than the scores or of
// a shape that does not broadcast to them, a negative softcap, ALiBi slopes that do not broadcast to the batch shape
// or an infinite slope, the lse asked of the module's head path, a NaN in the bias where a query reads, the standard
// ALiBi slopes (attn::alibi_slopes) of a negative number of heads. No mutant
// breaks a contract check (they share the driver's validation); this guards the contract module's rejections, which no
// other property calls.
#include <cmath>
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

namespace {

enum class Corruption {
    DkMismatch,
    TkMismatch,
    NegativeThreads,
    NanScale,
    SubnormalScale,
    NegativeBlock,
    NanRead,
    RankOne,
    BatchesDisagree,
    MaskMoreDims,
    WindowSide,
    BiasDtype,
    BiasMoreDims,
    BiasShape,
    NegativeSoftcap,
    SlopesShape,
    InfiniteSlope,
    LseOnHeadPath,
    NanBias,
    MaskShape,
    NegativeAlibiHeads,
    Count
};

const char* to_string(Corruption c) {
    switch (c) {
        case Corruption::DkMismatch: return "k's Dk unlike q's";
        case Corruption::TkMismatch: return "v's Tk unlike k's";
        case Corruption::NegativeThreads: return "num_threads = -1";
        case Corruption::NanScale: return "scale = NaN";
        case Corruption::SubnormalScale: return "a scale below the normal range";
        case Corruption::NegativeBlock: return "tiled_key_block = -1";
        case Corruption::NanRead: return "a NaN in q, k or v where a query reads";
        case Corruption::RankOne: return "q of rank 1";
        case Corruption::BatchesDisagree: return "k's heads unlike q's, neither of them 1";
        case Corruption::MaskMoreDims: return "an allowed mask of rank 5";
        case Corruption::WindowSide: return "window (-2, 0)";
        case Corruption::BiasDtype: return "a bias of another dtype";
        case Corruption::BiasMoreDims: return "a bias of rank 5";
        case Corruption::BiasShape: return "a bias (Tq + 1, Tk)";
        case Corruption::NegativeSoftcap: return "softcap = -1";
        case Corruption::SlopesShape: return "ALiBi slopes (H + 1)";
        case Corruption::InfiniteSlope: return "an infinite ALiBi slope";
        case Corruption::LseOnHeadPath: return "the lse asked of the module's head path";
        case Corruption::NanBias: return "a NaN in the bias where a query reads";
        case Corruption::MaskShape: return "an allowed mask (Tq + 1, Tk)";
        case Corruption::NegativeAlibiHeads: return "attn::alibi_slopes of -H heads";
        case Corruption::Count: break;
    }
    return "?";
}

}  // namespace

Property bad_calls_are_refused_with_an_error_naming_them() {
    Property p;
    p.name = "bad_calls_are_refused_with_an_error_naming_them";
    p.sentence = "A call with mismatched or non-broadcasting shapes (inputs, mask, bias, ALiBi slopes), a negative "
                 "thread count, a NaN or subnormal scale, a negative tiled block size, a window side below -1, a "
                 "negative softcap, a bias of another dtype, an infinite slope, a NaN where a query reads, or the "
                 "standard ALiBi slopes of a negative number of heads is "
                 "refused with the error of its kind (ShapeError, ConfigError, ValueError) and a message naming the "
                 "offending dimension, option or tensor.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::None}); };
    p.breadth = 4;  // many refusals, one per case, each cheap
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        const auto kind = static_cast<Corruption>(rng.below(static_cast<std::uint64_t>(Corruption::Count)));
        // The suite's adapter of the module's head path takes a rank-5 mask as the grouped-query layout's and merges
        // its dims 1 and 2 (registry.cpp, run_mha_path): a rank-5 mask is not a mistake there.
        if (kind == Corruption::MaskMoreDims && impl.name == "mha") return std::nullopt;
        // The lse is a refusal of the module's head path only (the SDPA backends return it).
        if (kind == Corruption::LseOnHeadPath && impl.name != "mha") return std::nullopt;
        // The library's slope schedule, whoever the implementation: its one refusal.
        if (kind == Corruption::NegativeAlibiHeads)
            return refused_with([&] { (void)alibi_slopes(-c.H); }, to_string(kind), "ConfigError",
                                "alibi_slopes: heads must be >= 0, got " + std::to_string(-c.H));
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            // A NaN bias also with one query and one key: the head path's bias (B, H, 1, 1) then has a head
            // stride of 1, which its check must not take for a head shared by all.
            const bool single = kind == Corruption::NanBias && rng.below(4) == 0;
            const Index B = c.B, H = c.H, Tq = single ? 1 : c.Tq, Tk = single ? 1 : c.Tk, Dk = c.Dk, Dv = c.Dv;
            // Heads of q, and of k and v: with BatchesDisagree both above 1 and unequal, so they do not broadcast.
            const Index Hq = kind == Corruption::BatchesDisagree ? H + 1 : H;
            const Index Hkv = kind == Corruption::BatchesDisagree ? H + 2 : H;
            Tensor<T> q = kind == Corruption::RankOne ? normal_tensor<T>({Dk}, rng)
                                                      : normal_tensor<T>({B, Hq, Tq, Dk}, rng);
            Tensor<T> k = normal_tensor<T>({B, Hkv, Tk, kind == Corruption::DkMismatch ? Dk + 1 : Dk}, rng);
            Tensor<T> v = normal_tensor<T>({B, Hkv, kind == Corruption::TkMismatch ? Tk + 1 : Tk, Dv}, rng);
            std::optional<Tensor<bool>> mask;
            Tensor<T> bias, slopes;
            using Other = std::conditional_t<std::is_same_v<T, float>, double, float>;
            Tensor<Other> other_bias;
            SdpaOptions options;
            const char *expected_kind = "", *keyword = "";
            std::string keyword_text;  // a keyword built for the case (keyword points into it)
            std::string nan_named;  // NanRead, NanBias: the element (and tensor) the message must name
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
                case Corruption::NanRead: {
                    // Every query reads every key, so the NaN is read wherever it lies; the message names the
                    // tensor, its shape and the element: "k [B, H, Tk, Dk] holds nan at batch index [b, h], row j,
                    // column d" (the module's head path names its own tensors: the value alone there).
                    const int which = static_cast<int>(rng.below(3));
                    Tensor<T>& x = which == 0 ? q : which == 1 ? k : v;
                    const Index at = static_cast<Index>(rng.below(static_cast<std::uint64_t>(x.numel())));
                    x[at] = std::numeric_limits<T>::quiet_NaN();
                    mask = Tensor<bool>({Tq, Tk}, true);  // allows every key: named among the call's shapes
                    const Index cols = x.dim(3), rows = x.dim(2), bh = at / (cols * rows);
                    nan_named = std::string(which == 0 ? "q" : which == 1 ? "k" : "v") + " " +
                                attn::to_string(x.shape()) + " holds nan at batch index " +
                                attn::to_string(Shape{bh / x.dim(1), bh % x.dim(1)}) + ", row " +
                                std::to_string(at / cols % rows) + ", column " + std::to_string(at % cols);
                    expected_kind = "ValueError", keyword = "holds nan";
                    break;
                }
                case Corruption::RankOne: expected_kind = "ShapeError", keyword = "rank >= 2"; break;
                case Corruption::BatchesDisagree:
                    // The module's head path names its own rule, with both counts: query heads a multiple of the K/V
                    // heads.
                    expected_kind = "ShapeError";
                    keyword_text = impl.name == "mha" ? "q has H=" + std::to_string(H + 1) +
                                                            " heads, not a multiple of the G=" + std::to_string(H + 2) +
                                                            " kv heads of k"
                                                      : "do not broadcast";
                    keyword = keyword_text.c_str();
                    break;
                case Corruption::MaskMoreDims:
                    mask = Tensor<bool>({1, B, H, Tq, Tk}, true);
                    expected_kind = "ShapeError", keyword = "has more dims than the scores";
                    break;
                case Corruption::WindowSide:
                    options.window = SlidingWindow{.left = -2, .right = 0};
                    expected_kind = "ConfigError", keyword = "sides must be -1 (unbounded) or >= 0";
                    break;
                case Corruption::BiasDtype:
                    other_bias = Tensor<Other>({Tq, Tk}, Other(0));
                    options.bias = FloatView(other_bias);
                    expected_kind = "ConfigError", keyword = "bias has dtype";
                    break;
                case Corruption::BiasMoreDims:
                    bias = Tensor<T>({1, B, H, Tq, Tk}, T(0));
                    options.bias = FloatView(bias);
                    expected_kind = "ShapeError", keyword = "has more dims than the scores";
                    break;
                case Corruption::BiasShape:
                    bias = Tensor<T>({Tq + 1, Tk}, T(0));
                    options.bias = FloatView(bias);
                    expected_kind = "ShapeError", keyword = "does not broadcast to the scores";
                    break;
                case Corruption::NegativeSoftcap:
                    options.softcap = -1, expected_kind = "ConfigError", keyword = "softcap must be 0 (off)";
                    break;
                case Corruption::SlopesShape:
                    slopes = Tensor<T>({H + 1}, T(0.5));
                    options.alibi_slopes = FloatView(slopes);
                    expected_kind = "ShapeError", keyword = "alibi_slopes";
                    break;
                case Corruption::InfiniteSlope:
                    slopes = Tensor<T>({H}, T(0.5));
                    slopes[static_cast<Index>(rng.below(static_cast<std::uint64_t>(H)))] =
                        std::numeric_limits<T>::infinity();
                    options.alibi_slopes = FloatView(slopes);
                    expected_kind = "ValueError", keyword = "every slope must be finite";
                    break;
                case Corruption::LseOnHeadPath:
                    options.return_lse = true, expected_kind = "ConfigError", keyword = "returns no lse";
                    break;
                case Corruption::NanBias: {
                    // No mask and no positional rule here: every position is read. The bias one (Tq, Tk) for all,
                    // one number per head (H, 1, 1): a head stride of 1 once broadcast, or (B, H, Tq, Tk).
                    const Shape shapes[] = {{Tq, Tk}, {H, 1, 1}, {B, H, Tq, Tk}};
                    bias = Tensor<T>(shapes[rng.below(3)], T(0));
                    const Index at = static_cast<Index>(rng.below(static_cast<std::uint64_t>(bias.numel())));
                    bias[at] = std::numeric_limits<T>::quiet_NaN();
                    options.bias = FloatView(bias);
                    expected_kind = "ValueError", keyword = "holds nan";
                    // The library names the first score it reads the NaN at, in (b, h, i, j) order.
                    const Index j = bias.rank() == 3 ? 0 : at % Tk, i = bias.rank() == 3 ? 0 : at / Tk % Tq;
                    const Index h = bias.rank() == 3 ? at : bias.rank() == 4 ? at / (Tq * Tk) % H : 0;
                    const Index b = bias.rank() == 4 ? at / (H * Tq * Tk) : 0;
                    nan_named = "holds nan at batch index " + attn::to_string(Shape{b, h}) + ", row " +
                                std::to_string(i) + ", column " + std::to_string(j);
                    break;
                }
                case Corruption::MaskShape:
                    mask = Tensor<bool>({Tq + 1, Tk}, true);
                    expected_kind = "ShapeError", keyword = "does not broadcast to the scores";
                    break;
                case Corruption::NegativeAlibiHeads:  // checked above
                case Corruption::Count: break;
            }
            std::optional<TensorView<const bool>> mask_view;
            if (mask) mask_view = mask->view();
            const auto call = [&] { impl.run<T>(q.view(), k.view(), v.view(), mask_view, options); };
            if (Verdict v = refused_with(call, to_string(kind), expected_kind, keyword)) return v;
            // A refusal names the shapes of the call's tensors, the mask's among them (as the module's head path
            // sees it, there: the suite's adapter lays it out as the head path takes it).
            if (kind == Corruption::NanBias && is_library_path(impl))
                return refused_with(call, to_string(kind), expected_kind, nan_named);
            if (kind == Corruption::NanRead) {
                if (impl.name != "mha")
                    if (Verdict v = refused_with(call, to_string(kind), expected_kind, nan_named)) return v;
                return refused_with(call, to_string(kind), expected_kind,
                                    impl.name == "mha" ? "allowed_mask [" : "allowed_mask " + attn::to_string(Shape{Tq, Tk}));
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
