// Invariant: the thread count does not change a single bit of dq, dk or dv (no atomics; FlashAttention#414).
#include "../checks.hpp"

namespace attn::suite {

Property gradient_bits_do_not_depend_on_the_thread_count() {
    Property p;
    p.name = "gradient_bits_do_not_depend_on_the_thread_count";
    p.sentence = "The backward pass on 1, 2 or 3 threads gives bitwise the same dq, dk and dv, grouped K/V heads' sums "
                 "included.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.very_long_keys = true, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.cost = 2;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            SdpaOptions options = c.options;
            options.num_threads = 1;
            // An overflow is refused the same way on any thread count.
            const auto run = [&] { return run_backward_unless_overflow<T>(impl, c, options); };
            const std::optional<BackwardRun<T>> one = run();
            for (int threads : {2, 3}) {
                options.num_threads = threads;
                const std::optional<BackwardRun<T>> more = run();
                if (one.has_value() != more.has_value())
                    return "1 thread vs " + std::to_string(threads) + ": only one of them refused an overflow";
                if (!one) continue;
                const std::string vs = " on 1 thread vs " + std::to_string(threads) + " threads";
                if (Verdict v = bitwise_equal(c, one->grads.dq, more->grads.dq, "dq" + vs)) return v;
                if (Verdict v = bitwise_equal(c, one->grads.dk, more->grads.dk, "dk" + vs)) return v;
                if (Verdict v = bitwise_equal(c, one->grads.dv, more->grads.dv, "dv" + vs)) return v;
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
