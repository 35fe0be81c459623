// Fuzz target `backward`: attn::sdpa_backward after the forward on the `sdpa` target's random shapes, broadcasts,
// strided views, masks, windows, biases, ALiBi and values, with a random dout. Checked: the gradients have the
// inputs' shapes; a refusal is the one the contracts predict (the forward's, a dout a query reads that is not
// finite), a ValueError for overflow only where finite inputs can overflow; keys no query reads get
// exactly zero dk and dv, summed over broadcast batch elements too; finite inputs give finite gradients (dq of empty
// rows under the Nan policy aside); one thread gives the same bits; small finite cases are within the oracle's
// gradient bound for the backend that ran (oracle/BOUNDS.md sections 12, 12b). The tiled backward runs with the
// production blocks or, decoded from the input's last byte, blocks of 1-8 queries and 1-16 keys, so that small cases
// span several.
#include <cmath>
#include <cstring>
#include <limits>

#include "../candidate.hpp"
#include "../decode.hpp"
#include "attn/backward.hpp"
#include "attn/detail/problem.hpp"
#if ATTN_FUZZ_HAVE_ORACLE
#include "attn/oracle/backward.hpp"
#include "attn/oracle/metrics.hpp"
#endif

namespace attn::fuzz {
namespace {

template <class T>
void run(FuzzedDataProvider& in) {
    // 1. Structure, as the sdpa target decodes it (without its shape faults: the forward's refusals are its job).
    const Dims dims = Dims::decode(in);
    const auto profile_bits = in.ConsumeIntegral<std::uint8_t>();
    const ValueProfile profile{(profile_bits & 1u) != 0, (profile_bits & 2u) != 0};
    SdpaOptions options = decode_options(in, true);
    options.return_weights = false;
    const Shape& full_batch = dims.batch;
    Shape qs = broadcastable_shape(in, full_batch, 0), ks = broadcastable_shape(in, full_batch, 0),
          vs = broadcastable_shape(in, full_batch, 0);
    qs.insert(qs.end(), {dims.Tq, dims.Dk});
    ks.insert(ks.end(), {dims.Tk, dims.Dk});
    vs.insert(vs.end(), {dims.Tk, dims.Dv});
    const MaskSpec mask_spec = decode_mask_spec(in, dims);
    options.window = decode_window(mask_spec);
    options.softcap = decode_softcap(mask_spec);
    const BiasSpec bias_spec = decode_bias_spec(in, mask_spec, dims);
    const Layout ql = Layout::decode(in), kl = Layout::decode(in), vl = Layout::decode(in);

    // 2. Values, mask bits, bias; then dout (contiguous, the output's shape).
    ValueSource<T> values(in, profile);
    const SdpaOperands<T> operands =
        make_sdpa_operands(in, values, qs, ks, vs, ql, kl, vl, mask_spec, bias_spec, options);
    const Operand<T>&q = operands.q, &k = operands.k, &v = operands.v;
    const std::optional<Operand<bool>>& mask = operands.mask;
    const std::optional<TensorView<const bool>>& allowed_mask = operands.allowed_mask;
    const BiasOperands<T>& additive = operands.additive;
    current_config() = std::string("backward(dtype=") + dtype_name<T>() + "," + dims.describe() + ",q=" +
                       to_string(qs) + ql.describe() + ",k=" + to_string(ks) + kl.describe() + ",v=" + to_string(vs) +
                       vl.describe() + ",mask=" + kind_name(mask_spec.kind) + "," + describe(options) + ")";

    // 3. The forward; its refusals are the sdpa target's to check. Where it answers, the backward must too.
    options.return_lse = true;
    SdpaResult<T> forward;
    try {
        forward = scaled_dot_product_attention(q.view, k.view, v.view, allowed_mask, options);
    } catch (const Error&) {
        return;
    }
    Shape batch(forward.output.shape().begin(), forward.output.shape().end() - 2);
    Tensor<T> dout(forward.output.shape());
    for (Index x = 0; x < dout.numel(); ++x) dout[x] = values.next();
    const AllowedModel model = model_allowed(batch, dims.Tq, dims.Tk, mask ? &mask->view : nullptr, options,
                                             additive.bias ? &additive.bias->view : nullptr,
                                             additive.slopes ? &additive.slopes->view : nullptr);
    const ReadSummary reads = summarise_reads(model, q.view, k.view, v.view);
    const double scale = options.scale ? *options.scale : dims.Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(dims.Dk)) : 1.0;
    // Finite inputs may also overflow in the backward's own products: |dP| <= G = Dv max|dout| max|v|, |dS| <= 2 G,
    // |dq| <= |scale| Tk 2 G max|k| and |dk| <= |scale| Tq 2 G max|q| per batch element, |dv| <= Tq max|dout|, and the
    // sums over up to `batch` elements; against a quarter of the smaller of the compute and the storage type's max.
    const auto max_abs = [](const auto& view) {
        long double m = 0;
        for_each_index(view.shape(), [&](std::span<const Index> idx) {
            const long double x = std::fabs(static_cast<long double>(static_cast<double>(view.at(idx))));
            if (std::isfinite(x)) m = std::max(m, x);
        });
        return m;
    };
    const long double G = static_cast<long double>(dims.Dv) * max_abs(dout.view()) * max_abs(v.view);
    const long double n = static_cast<long double>(std::max<Index>(1, model.batch_count)) * (dims.Tq + dims.Tk + 1);
    const long double largest = std::max({G, 2 * G * std::fabs(static_cast<long double>(scale)) * n *
                                                 std::max(max_abs(q.view), max_abs(k.view)),
                                          n * max_abs(dout.view())});
    const long double limit = static_cast<long double>(
        std::min<double>(std::numeric_limits<compute_t<T>>::max(), static_cast<double>(static_cast<compute_t<T>>(std::numeric_limits<T>::max()))));
    const bool may_overflow = overflow_possible<T>(reads, scale) || largest >= limit / 4;
    bool dout_read_finite = true;  // every dout row a query with an allowed key owns is finite
    for (Index b = 0; b < model.batch_count; ++b)
        for (Index i = 0; i < dims.Tq; ++i)
            for (Index d = 0; model.nonempty(b, i) && d < dims.Dv; ++d)
                if (!std::isfinite(static_cast<double>(dout[(b * dims.Tq + i) * dims.Dv + d]))) dout_read_finite = false;

    if (const auto blocks = in.ConsumeIntegral<std::uint8_t>(); blocks != 0 && options.backend == Backend::Tiled) {
        options.tiled_query_block = 1 + (blocks & 7);
        options.tiled_key_block = 1 + (blocks >> 3 & 15);
    }

    // 4. The backward and its outcome.
    SdpaGradients<T> g;
    try {
        g = sdpa_backward(q.view, k.view, v.view, forward.output.view(), forward.lse->view(), dout.view(), allowed_mask,
                          options);
    } catch (const ValueError& e) {
        const std::string message = e.what();
        const bool overflow = contains(message, "overflowed") && may_overflow;
        const bool bad_dout = options.check_finite && !dout_read_finite && contains(message, "sdpa_backward: dout " + to_string(dout.shape()));
        ATTN_FUZZ_REQUIRE(overflow || bad_dout, "unexpected ValueError: " + message);
        return;
    } catch (const Error& e) {
        fail(__FILE__, __LINE__, std::string("the forward answered but the backward refused: ") + e.what());
    }
    ATTN_FUZZ_REQUIRE(!options.check_finite || dout_read_finite, "a non-finite dout a query reads was accepted");
    ATTN_FUZZ_REQUIRE(g.dq.shape() == qs && g.dk.shape() == ks && g.dv.shape() == vs,
                      "gradient shapes " + to_string(g.dq.shape()) + ", " + to_string(g.dk.shape()) + ", " +
                          to_string(g.dv.shape()));

    // 5. A key element (of k's or v's own shape) that no query of any batch element reading it may read: exactly 0.
    // read[] is indexed like a contiguous (k batch..., Tk) tensor, reached from each batch element by broadcasting.
    const auto key_rows = [](const Shape& s) {  // (batch..., Tk, 1) of k's or v's shape
        Shape r(s.begin(), s.end() - 1);
        r.push_back(1);
        return r;
    };
    Tensor<char> read_k(key_rows(ks)), read_v(key_rows(vs));
    for (auto* flags : {&read_k, &read_v}) {
        Shape full = batch;
        full.insert(full.end(), {dims.Tk, 1});
        const TensorView<const char> view = TensorView<const char>(flags->data(), flags->shape()).broadcast_to(full, "fuzz", "flags");
        const std::vector<Index> off = detail::batch_offsets(view, static_cast<Index>(batch.size()), batch);
        for (Index b = 0; b < model.batch_count; ++b)
            for (Index i = 0; i < dims.Tq; ++i)
                for (Index j = 0; j < dims.Tk; ++j)
                    if (model.at(b, i, j)) flags->data()[off[static_cast<std::size_t>(b)] + j * view.stride(-2)] = 1;
    }
    for (Index r = 0; r < read_k.numel(); ++r)
        for (Index d = 0; !read_k[r] && d < dims.Dk; ++d)
            ATTN_FUZZ_REQUIRE(g.dk[r * dims.Dk + d] == T(0), "dk of a key nobody reads is " + std::to_string(static_cast<double>(g.dk[r * dims.Dk + d])));
    for (Index r = 0; r < read_v.numel(); ++r)
        for (Index d = 0; !read_v[r] && d < dims.Dv; ++d)
            ATTN_FUZZ_REQUIRE(g.dv[r * dims.Dv + d] == T(0), "dv of a key nobody reads is " + std::to_string(static_cast<double>(g.dv[r * dims.Dv + d])));

    // 6. Finite inputs give finite gradients (the library vouches under check_finite; else where everything read is
    // finite and nothing can overflow); under the Nan policy an empty row's NaN dq may be summed into a shared row.
    const bool owe_finite = (options.check_finite || (reads.all_finite && dout_read_finite)) && !may_overflow;
    if (owe_finite) {
        for (const Tensor<T>* t : {&g.dk, &g.dv})
            for (Index x = 0; x < t->numel(); ++x)
                ATTN_FUZZ_REQUIRE(std::isfinite(static_cast<double>((*t)[x])), "non-finite dk or dv from finite inputs");
        if (options.empty_rows != EmptyRowPolicy::Nan)
            for (Index x = 0; x < g.dq.numel(); ++x)
                ATTN_FUZZ_REQUIRE(std::isfinite(static_cast<double>(g.dq[x])), "non-finite dq from finite inputs");
    }

    // 7. Determinism: one thread gives the same bits.
    if (options.num_threads != 1) {
        SdpaOptions one = options;
        one.num_threads = 1;
        const SdpaGradients<T> serial = sdpa_backward(q.view, k.view, v.view, forward.output.view(), forward.lse->view(),
                                                      dout.view(), allowed_mask, one);
        ATTN_FUZZ_REQUIRE(bitwise_equal(serial.dq, g.dq) && bitwise_equal(serial.dk, g.dk) &&
                              bitwise_equal(serial.dv, g.dv),
                          "gradient bits depend on the thread count");
    }

#if ATTN_FUZZ_HAVE_ORACLE
    // 8. Small finite cases: within the oracle's gradient bound for the backward that ran (Backend::Auto runs the
    // reference one on cases this small).
    if (reads.all_finite && dout_read_finite && !may_overflow &&
        small_enough_for_oracle(model.batch_count, dims.Tq, dims.Tk, dims.Dk, dims.Dv)) {
        oracle::OracleOptions oo;
        oo.model = options.backend == Backend::Tiled ? oracle::library_tiled_model() : oracle::reference_model();
        const oracle::Gradients<T> exact =
            oracle::sdpa_backward<T>(q.view, k.view, v.view, dout.view(), allowed_mask, options, oo);
        for (const auto which : {oracle::Gradient::Dq, oracle::Gradient::Dk, oracle::Gradient::Dv}) {
            const Tensor<T>& got = which == oracle::Gradient::Dq ? g.dq : which == oracle::Gradient::Dk ? g.dk : g.dv;
            const oracle::Comparison c = oracle::compare_gradient<T>(got.view(), exact, which);
            ATTN_FUZZ_REQUIRE(c.pass(), std::string(oracle::gradient_name(which)) + " outside the oracle's bound: " +
                                            c.summary());
        }
    }
#endif
}

}  // namespace
}  // namespace attn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    return attn::fuzz::run_in_decoded_dtype(data, size, [](auto tag, FuzzedDataProvider& in) {
        attn::fuzz::run<decltype(tag)>(in);
    });
}
