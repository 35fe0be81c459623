// Fuzz target `backends`: every registered correct implementation (reference, tiled, mha, and whatever registers
// later) agrees with `reference`: the same outcome (result or error kind), the same empty rows, bitwise the same
// result on 1 and 2 threads, and, for cases with finite inputs, each within the oracle's bound for its own error
// model. Key counts reach past the tiled backend's key block (256) so its rescaling runs. ATTN_FUZZ_IMPL=<name>
// checks that one implementation (a mutant, say) against reference instead of all correct ones.
#include <cstring>

#include "../candidate.hpp"
#include "../decode.hpp"

namespace attn::fuzz {
namespace {

template <class T>
void run(FuzzedDataProvider& in) {
    // 1. Structure: the usual small shapes, or one long row of keys (past the tiled key block) with small D.
    Dims dims = Dims::decode(in, 6, 6);
    const auto long_keys = in.ConsumeIntegral<std::uint8_t>();
    if (long_keys >= 200) {
        if (dims.batch.size() > 1) dims.batch.erase(dims.batch.begin() + 1, dims.batch.end());
        dims.Tq = std::min<Index>(dims.Tq, 2);
        dims.Dk = std::min<Index>(dims.Dk, 2);
        dims.Dv = std::min<Index>(dims.Dv, 2);
        dims.Tk = 250 + in.ConsumeIntegralInRange<Index>(0, 300);
    }
    const auto profile_bits = in.ConsumeIntegral<std::uint8_t>();
    const ValueProfile profile{(profile_bits & 7u) == 7u, (profile_bits & 6u) == 2u};
    SdpaOptions options = decode_options(in, false);
    Shape qs = broadcastable_shape(in, dims.batch, 0), ks = broadcastable_shape(in, dims.batch, 0),
          vs = broadcastable_shape(in, dims.batch, 0);
    qs.insert(qs.end(), {dims.Tq, dims.Dk});
    ks.insert(ks.end(), {dims.Tk, dims.Dk});
    vs.insert(vs.end(), {dims.Tk, dims.Dv});
    const MaskSpec spec = decode_mask_spec(in, dims);
    options.window = decode_window(spec);
    options.softcap = decode_softcap(spec);
    const BiasSpec bias_spec = decode_bias_spec(in, spec, dims);
    const Layout ql = Layout::decode(in), kl = Layout::decode(in), vl = Layout::decode(in);
    ValueSource<T> values(in, profile);
    const SdpaOperands<T> operands = make_sdpa_operands(in, values, qs, ks, vs, ql, kl, vl, spec, bias_spec, options);
    const Operand<T>&q = operands.q, &k = operands.k, &v = operands.v;
    const std::optional<Operand<bool>>& mask = operands.mask;
    const std::optional<TensorView<const bool>>& allowed_mask = operands.allowed_mask;
    const BiasOperands<T>& additive = operands.additive;
    const std::optional<Operand<T>>& bias = additive.bias;
    const std::optional<Operand<T>>& slopes = additive.slopes;
    current_config() = std::string("backends(dtype=") + dtype_name<T>() + "," +
                       dims.describe() + ",q=" + to_string(qs) + ql.describe() + ",k=" + to_string(ks) +
                       kl.describe() + ",v=" + to_string(vs) + vl.describe() + ",mask=" + kind_name(spec.kind) +
                       (mask ? to_string(spec.shape) : std::string()) + "," + describe(options) + ",values=" +
                       (profile.specials ? "special" : profile.wide ? "wide" : "tame") + ",impl=" + candidate_name() +
                       ")";

    // 2. Reference, and what the model says about the case.
    const suite::Implementation& reference = suite::implementation("reference");
    const Outcome<SdpaResult<T>> expected =
        attempt<SdpaResult<T>>([&] { return reference.run<T>(q.view, k.view, v.view, allowed_mask, options); });
    std::optional<AllowedModel> model;
    bool finite_case = false;
    double scale = 1.0;
    if (expected.result) {
        const auto batch = broadcast_model(*broadcast_model(Shape(qs.begin(), qs.end() - 2), Shape(ks.begin(), ks.end() - 2)),
                                           Shape(vs.begin(), vs.end() - 2));
        model = model_allowed(*batch, dims.Tq, dims.Tk, mask ? &mask->view : nullptr, options,
                              bias ? &bias->view : nullptr, slopes ? &slopes->view : nullptr);
        const ReadSummary reads = summarise_reads(*model, q.view, k.view, v.view);
        scale = options.scale ? *options.scale : dims.Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(dims.Dk)) : 1.0;
        finite_case = reads.all_finite && !overflow_possible<T>(reads, scale);
    }

    // 3. Every other implementation against it.
    std::vector<const suite::Implementation*> candidates;
    if (candidate_implementation()) candidates = {candidate_implementation()};
    else
        for (const suite::Implementation* impl : suite::correct_implementations())
            if (impl->name != "reference") candidates.push_back(impl);
    // The head path takes (B, H, T, D) with kv heads G | H and maps head h to kv head h / (H/G); it means what
    // SDPA's broadcasting means when G is 1 or H.
    const bool head_layout = qs.size() == 4 && ks.size() == 4 && vs.size() == 4 && ks[1] == vs[1] &&
                             (ks[1] == 1 || ks[1] == qs[1]) && (!mask || spec.shape.size() <= 4);
    for (const suite::Implementation* impl : candidates) {
        if (impl->name == "mha" && !head_layout) continue;
        if (!candidate_implementation() && impl->dtype_unsupported.count(suite::dtype_of<T>())) continue;  // no path
        // tiled never forms weights (asking it for them is a ConfigError, covered by the unit tests), nor does any
        // implementation registered without them: compare outputs.
        SdpaOptions impl_options = options;
        if (!impl->returns_weights) impl_options.return_weights = false;
        // A variant one of the suite's kernels does not implement (fa2_style and flash_decoding do not soft-cap)
        // skips that kernel only; the input still compares the others. A selected candidate skips the input.
        std::optional<Outcome<SdpaResult<T>>> attempted;
        try {
            attempted = attempt<SdpaResult<T>>(
                [&] { return run_implementation<T>(*impl, q.view, k.view, v.view, allowed_mask, impl_options); });
        } catch (const SkipInput&) {
            if (candidate_implementation()) throw;
            continue;
        }
        const Outcome<SdpaResult<T>>& got = *attempted;
        const std::string who = impl->name + " vs reference: ";
        const bool overflow_either = contains(got.message, "overflowed") || contains(expected.message, "overflowed");
        ATTN_FUZZ_REQUIRE(got.kind == expected.kind || (overflow_either && !finite_case),
                          who + "'" + got.kind + "' (" + got.message + ") vs '" + expected.kind + "' (" +
                              expected.message + ")");
        if (!got.result || !expected.result) continue;
        const SdpaResult<T>& a = *got.result;
        const SdpaResult<T>& r = *expected.result;
        ATTN_FUZZ_REQUIRE(a.output.shape() == r.output.shape(), who + "output shape " + to_string(a.output.shape()));
        ATTN_FUZZ_REQUIRE(a.weights.has_value() == (r.weights.has_value() && impl_options.return_weights),
                          who + "weights returned by one only");
        // Empty rows follow the policy identically (0 or NaN, whatever the backend).
        for (Index b = 0; b < model->batch_count; ++b)
            for (Index i = 0; i < dims.Tq; ++i) {
                if (model->nonempty(b, i)) continue;
                const Index at = (b * dims.Tq + i) * dims.Dv;
                ATTN_FUZZ_REQUIRE(std::memcmp(a.output.data() + at, r.output.data() + at,
                                              static_cast<std::size_t>(dims.Dv) * sizeof(T)) == 0,
                                  who + "empty row " + std::to_string(i) + " differs");
            }
        // Determinism: two threads give the bits of one.
        SdpaOptions two = impl_options;
        two.num_threads = 2;
        const Outcome<SdpaResult<T>> threaded =
            attempt<SdpaResult<T>>([&] { return run_implementation<T>(*impl, q.view, k.view, v.view, allowed_mask, two); });
        ATTN_FUZZ_REQUIRE(threaded.result && bitwise_equal(threaded.result->output, a.output),
                          who + "output bits depend on the thread count");
        if (finite_case) {
            for (Index n = 0; n < a.output.numel(); ++n)
                ATTN_FUZZ_REQUIRE(std::isfinite(a.output[n]) || options.empty_rows == EmptyRowPolicy::Nan,
                                  who + "non-finite output from finite inputs");
#if ATTN_FUZZ_HAVE_ORACLE
            if (small_enough_for_oracle(model->batch_count, dims.Tq, dims.Tk, dims.Dk, dims.Dv))
                require_within_oracle_bound<T>(a, q.view, k.view, v.view, allowed_mask, impl_options, impl->error_model,
                                               impl->name + ": ");
#endif
        }
    }
}

}  // namespace
}  // namespace attn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    try {
        if (in.ConsumeBool()) {
            attn::fuzz::run<double>(in);
        } else {
            // The profile byte decides float or a 16-bit type (decode.hpp): read ahead on a second reader of the same bytes, as run decodes.
            FuzzedDataProvider ahead(data, size);
            (void)ahead.ConsumeBool();
            const attn::fuzz::Dims dims = attn::fuzz::Dims::decode(ahead, 6, 6);
            if (ahead.ConsumeIntegral<std::uint8_t>() >= 200) (void)ahead.ConsumeIntegralInRange<attn::Index>(0, 300);
            (void)dims;
            switch (attn::fuzz::sixteen_bit_choice((ahead.ConsumeIntegral<std::uint8_t>() >> 3) & 7u)) {
                case 16: attn::fuzz::run<attn::float16>(in); break;
                case 8: attn::fuzz::run<attn::bfloat16>(in); break;
                default: attn::fuzz::run<float>(in); break;
            }
        }
    } catch (const attn::fuzz::SkipInput&) {
        return -1;  // the candidate does not support this input: keep it out of the corpus
    }
    return 0;
}
