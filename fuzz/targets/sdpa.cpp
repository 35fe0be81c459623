// Fuzz target `sdpa`: scaled_dot_product_attention on random shapes, strided views, masks, values and options,
// checked against a model of its contracts (which error, which rows are empty, which outputs must be finite),
// against itself on one thread (determinism) and against the oracle on small cases.
#include <cmath>
#include <cstring>
#include <limits>

#include "../candidate.hpp"
#include "../decode.hpp"

namespace attn::fuzz {
namespace {

enum class Expect { Success, ShapeError, ConfigError, MaskError, ValueError };

const char* expect_name(Expect e) {
    switch (e) {
        case Expect::Success: return "success";
        case Expect::ShapeError: return "ShapeError";
        case Expect::ConfigError: return "ConfigError";
        case Expect::MaskError: return "MaskError";
        case Expect::ValueError: return "ValueError";
    }
    return "?";
}

Expect kind_of(const Error& e) {
    if (dynamic_cast<const ShapeError*>(&e)) return Expect::ShapeError;
    if (dynamic_cast<const ConfigError*>(&e)) return Expect::ConfigError;
    if (dynamic_cast<const MaskError*>(&e)) return Expect::MaskError;
    if (dynamic_cast<const ValueError*>(&e)) return Expect::ValueError;
    return Expect::Success;  // a bare attn::Error or IoError: not a documented kind for sdpa
}

// Deliberate shape faults, so the error paths are fuzzed as much as the happy path.
enum class Corruption { None, KDk, VTk, QRank, Batch, MaskDim, MaskRank };

template <class T>
void run(FuzzedDataProvider& in) {
    // 1. Structure.
    const Dims dims = Dims::decode(in);
    const auto profile_bits = in.ConsumeIntegral<std::uint8_t>();
    const ValueProfile profile{(profile_bits & 1u) != 0, (profile_bits & 2u) != 0};
    SdpaOptions options = decode_options(in, true);
    const bool explicit_scale = in.ConsumeIntegral<std::uint8_t>() >= 224;
    const auto corruption_byte = in.ConsumeIntegral<std::uint8_t>();
    const Corruption corruption =
        corruption_byte >= 240 ? static_cast<Corruption>(1 + (corruption_byte - 240) % 6) : Corruption::None;
    const Shape full_batch = dims.batch;
    Shape qs = broadcastable_shape(in, full_batch, 0), ks = broadcastable_shape(in, full_batch, 0),
          vs = broadcastable_shape(in, full_batch, 0);
    qs.insert(qs.end(), {dims.Tq, dims.Dk});
    ks.insert(ks.end(), {dims.Tk, dims.Dk});
    vs.insert(vs.end(), {dims.Tk, dims.Dv});
    MaskSpec mask_spec = decode_mask_spec(in, dims);
    options.window = decode_window(mask_spec);
    options.softcap = decode_softcap(mask_spec);
    const BiasSpec bias_spec = decode_bias_spec(in, mask_spec, dims);
    const Layout ql = Layout::decode(in), kl = Layout::decode(in), vl = Layout::decode(in);
    const auto fault_pick = in.ConsumeIntegral<std::uint8_t>();
    switch (corruption) {
        case Corruption::KDk: ks.back() += 1; break;
        case Corruption::VTk: vs[vs.size() - 2] += 1; break;
        case Corruption::QRank: qs.erase(qs.begin(), qs.end() - 1); break;
        case Corruption::Batch:  // two batch extents > 1 that differ
            qs.insert(qs.begin(), 2);
            ks.insert(ks.begin(), 3);
            break;
        case Corruption::MaskDim:
            if (mask_spec.kind != MaskKind::None) {
                Index& d = mask_spec.shape[fault_pick % mask_spec.shape.size()];
                d = d == 0 ? 2 : d + 1;
            }
            break;
        case Corruption::MaskRank:
            if (mask_spec.kind != MaskKind::None)
                while (mask_spec.shape.size() <= full_batch.size() + 2) mask_spec.shape.insert(mask_spec.shape.begin(), 2);
            break;
        case Corruption::None: break;
    }

    // 2. Values, then mask bits.
    ValueSource<T> values(in, profile);
    const auto fill = [&](Index) { return values.next(); };
    const Operand<T> q = make_operand<T>("q", qs, ql, fill);
    const Operand<T> k = make_operand<T>("k", ks, kl, fill);
    const Operand<T> v = make_operand<T>("v", vs, vl, fill);
    if (explicit_scale) options.scale = static_cast<double>(values.next());
    std::optional<Operand<bool>> mask;
    std::optional<TensorView<const bool>> allowed_mask;
    if (mask_spec.kind != MaskKind::None) {
        mask = make_mask(in, mask_spec, mask_spec.shape);
        allowed_mask = mask->view;
    }
    const BiasOperands<T> additive = make_bias_operands(in, values, bias_spec, options);
    const std::optional<Operand<T>>& bias = additive.bias;
    const std::optional<Operand<T>>& slopes = additive.slopes;
    current_config() = std::string("sdpa(dtype=") + dtype_name<T>() + "," +
                       dims.describe() + ",q=" + to_string(qs) + ql.describe() + ",k=" + to_string(ks) +
                       kl.describe() + ",v=" + to_string(vs) + vl.describe() + ",mask=" + kind_name(mask_spec.kind) +
                       (mask ? to_string(mask_spec.shape) + mask_spec.layout.describe() : std::string()) + "," +
                       describe(options) + ",values=" + (profile.specials ? "special" : profile.wide ? "wide" : "tame") +
                       ",impl=" + candidate_name() + ")";

    // 3. What the contracts predict.
    Expect expect = Expect::Success;
    std::optional<Shape> batch;
    AllowedModel model;
    ReadSummary reads;
    bool may_overflow = false;
    if (qs.size() < 2 || ks.size() < 2 || vs.size() < 2 || ks.back() != qs.back() || vs[vs.size() - 2] != ks[ks.size() - 2]) {
        expect = Expect::ShapeError;
    } else {
        const Shape qb(qs.begin(), qs.end() - 2), kb(ks.begin(), ks.end() - 2), vb(vs.begin(), vs.end() - 2);
        const auto qk = broadcast_model(qb, kb);
        if (qk) batch = broadcast_model(*qk, vb);
        if (!batch) {
            expect = Expect::ShapeError;
        } else {
            Shape scores = *batch;
            scores.insert(scores.end(), {dims.Tq, dims.Tk});
            const auto fits = [](const Shape& shape, const Shape& target) {
                return shape.size() <= target.size() && broadcast_model(shape, target) == target;
            };
            if ((mask && !fits(mask_spec.shape, scores)) || (bias && !fits(bias_spec.bias_shape, scores)) ||
                (slopes && !fits(bias_spec.slopes_shape, *batch)))
                expect = Expect::ShapeError;
        }
    }
    // The scale must be finite in the type the logits are scaled in (T, float for 16-bit storage), and 0 or normal
    // once rounded to it (a subnormal scale rounds absolutely).
    using C = compute_t<T>;
    if (expect == Expect::Success && options.scale &&
        (!std::isfinite(*options.scale) || !std::isfinite(static_cast<C>(*options.scale)) ||
         (*options.scale != 0 && std::fabs(static_cast<C>(*options.scale)) < std::numeric_limits<C>::min())))
        expect = Expect::ConfigError;
    const double scale = options.scale ? *options.scale : dims.Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(dims.Dk)) : 1.0;
    if (expect == Expect::Success) {
        model = model_allowed(*batch, dims.Tq, dims.Tk, mask ? &mask->view : nullptr, options,
                              bias ? &bias->view : nullptr, slopes ? &slopes->view : nullptr);
        reads = summarise_reads(model, q.view, k.view, v.view);
        may_overflow = overflow_possible<T>(reads, scale);
        if (model.any_empty_row() && options.empty_rows == EmptyRowPolicy::Throw) expect = Expect::MaskError;
        else if (model.slopes_refused) expect = Expect::ValueError;  // whatever check_finite says
        else if (options.check_finite && !reads.all_finite) expect = Expect::ValueError;
    }

    // 4. Run and check the outcome.
    SdpaResult<T> result;
    try {
        result = run_candidate<T>(q.view, k.view, v.view, allowed_mask, options);
    } catch (const Error& e) {
        const std::string message = e.what();
        const Expect got = kind_of(e);
        const bool overflow = got == Expect::ValueError && contains(message, "overflowed");
        const bool legit_overflow = expect == Expect::Success && options.check_finite && may_overflow && overflow;
        ATTN_FUZZ_REQUIRE(got == expect || legit_overflow, std::string("expected ") + expect_name(expect) + ", got " +
                                                              expect_name(got) + ": " + message);
        if (!candidate_is_library()) return;
        ATTN_FUZZ_REQUIRE(message.rfind("sdpa: ", 0) == 0, "the message does not name the function: " + message);
        if (got == Expect::ShapeError) {
            ATTN_FUZZ_REQUIRE(contains(message, "q " + to_string(qs)) && contains(message, "k " + to_string(ks)) &&
                                  contains(message, "v " + to_string(vs)),
                              "the message does not name every tensor with its shape: " + message);
            if (mask) ATTN_FUZZ_REQUIRE(contains(message, "allowed_mask " + to_string(mask_spec.shape)),
                                        "the message does not name the mask's shape: " + message);
        }
        if (got == Expect::MaskError) {  // names the first empty row, in flat batch order
            Index b = 0, i = 0;
            while (model.nonempty(b, i))
                if (++i == dims.Tq) i = 0, ++b;
            const Shape idx = batch_index(*batch, b, 0, 0);
            const std::string where = "query row " + std::to_string(i) + " of batch index " +
                                      to_string(Shape(idx.begin(), idx.end() - 2));
            ATTN_FUZZ_REQUIRE(contains(message, where), "the message does not name " + where + ": " + message);
        }
        if (got == Expect::ValueError && !overflow)
            ATTN_FUZZ_REQUIRE(contains(message, "q " + to_string(qs)) || contains(message, "k " + to_string(ks)) ||
                                  contains(message, "v " + to_string(vs)) ||
                                  (bias && contains(message, "bias " + to_string(bias_spec.bias_shape))) ||
                                  (slopes && contains(message, "alibi_slopes " + to_string(bias_spec.slopes_shape))),
                              "the message does not name the tensor holding the value: " + message);
        return;
    } catch (const std::exception& e) {
        fail(__FILE__, __LINE__, std::string("an exception outside attn::Error: ") + e.what());
    }
    ATTN_FUZZ_REQUIRE(expect == Expect::Success, std::string("expected ") + expect_name(expect) + ", got success");

    // 5. Properties of a returned result.
    Shape out_shape = *batch, w_shape = *batch;
    out_shape.insert(out_shape.end(), {dims.Tq, dims.Dv});
    w_shape.insert(w_shape.end(), {dims.Tq, dims.Tk});
    ATTN_FUZZ_REQUIRE(result.output.shape() == out_shape, "output shape " + to_string(result.output.shape()));
    ATTN_FUZZ_REQUIRE(result.weights.has_value() == options.return_weights, "weights returned iff asked");
    if (result.weights) ATTN_FUZZ_REQUIRE(result.weights->shape() == w_shape, "weights shape " + to_string(result.weights->shape()));
    // A finite output row is owed when check_finite vouched for the inputs, or when everything that row may read is
    // finite and nothing can overflow: a NaN that only other rows may read must not reach it (pytorch#101967).
    for (Index b = 0; b < model.batch_count; ++b) {
        for (Index i = 0; i < dims.Tq; ++i) {
            const T* out = result.output.data() + (b * dims.Tq + i) * dims.Dv;
            const T* w = result.weights ? result.weights->data() + (b * dims.Tq + i) * dims.Tk : nullptr;
            const std::string row = "batch " + std::to_string(b) + ", query row " + std::to_string(i);
            // check_finite vouches for the library only, which refuses an overflow (ValueError above); any other
            // candidate (an external kernel, under the same validation) owes a finite row where nothing can
            // overflow (found by attn fuzz --kernel: a logit beyond max/4 overflowed to -inf in a correct kernel).
            const bool owe_finite = (options.check_finite && candidate_is_library()) ||
                                    (reads.row_finite[static_cast<std::size_t>(b * dims.Tq + i)] && !may_overflow);
            if (!model.nonempty(b, i)) {
                const bool nan = options.empty_rows == EmptyRowPolicy::Nan;
                for (Index d = 0; d < dims.Dv; ++d)
                    ATTN_FUZZ_REQUIRE(nan ? std::isnan(out[d]) : out[d] == T(0),
                                      "empty " + row + " does not follow the policy: output " + std::to_string(out[d]));
                for (Index j = 0; w && j < dims.Tk; ++j)
                    ATTN_FUZZ_REQUIRE(nan ? std::isnan(w[j]) : w[j] == T(0),
                                      "empty " + row + " does not follow the policy: weight " + std::to_string(w[j]));
                continue;
            }
            if (owe_finite)
                for (Index d = 0; d < dims.Dv; ++d)
                    ATTN_FUZZ_REQUIRE(std::isfinite(out[d]), "non-finite output " + std::to_string(out[d]) + " at " + row +
                                                                 ", column " + std::to_string(d) + " from finite inputs");
            // (A row that reads a NaN has NaN weights everywhere, blocked keys included, as -inf - NaN is NaN.)
            for (Index j = 0; w && owe_finite && j < dims.Tk; ++j) {
                if (!model.at(b, i, j))
                    ATTN_FUZZ_REQUIRE(w[j] == T(0), "blocked key " + std::to_string(j) + " has weight " +
                                                        std::to_string(w[j]) + " at " + row);
                else
                    ATTN_FUZZ_REQUIRE(w[j] >= T(0) && w[j] <= T(1),
                                      "weight " + std::to_string(w[j]) + " outside [0, 1] at " + row);
            }
        }
    }

    // 6. Determinism: the same call on one thread gives the same bits.
    if (options.num_threads != 1) {
        SdpaOptions one = options;
        one.num_threads = 1;
        const SdpaResult<T> serial = run_candidate<T>(q.view, k.view, v.view, allowed_mask, one);
        ATTN_FUZZ_REQUIRE(bitwise_equal(serial.output, result.output), "output bits depend on the thread count");
        if (result.weights)
            ATTN_FUZZ_REQUIRE(bitwise_equal(*serial.weights, *result.weights), "weight bits depend on the thread count");
    }

#if ATTN_FUZZ_HAVE_ORACLE
    // 7. Small cases with finite inputs: within the oracle's bound.
    if (reads.all_finite && !may_overflow &&
        small_enough_for_oracle(model.batch_count, dims.Tq, dims.Tk, dims.Dk, dims.Dv))
        require_within_oracle_bound<T>(result, q.view, k.view, v.view, allowed_mask, options);
#endif
}

}  // namespace
}  // namespace attn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return attn::fuzz::run_in_decoded_dtype(data, size, [](auto tag, FuzzedDataProvider& in) {
        attn::fuzz::run<decltype(tag)>(in);
    });
}
