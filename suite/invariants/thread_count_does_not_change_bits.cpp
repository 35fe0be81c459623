// Invariant 16: the thread count does not change a single bit of the output.
#include "../checks.hpp"

namespace attn::suite {

Property thread_count_does_not_change_bits() {
    Property p;
    p.name = "thread_count_does_not_change_bits";
    p.sentence = "Running on 1, 2, 3 or 4 threads gives bitwise the same output.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.very_long_keys = true, .bias = true}); };
    p.cost = 2;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            SdpaOptions options = c.options;
            options.num_threads = 1;
            const Tensor<T> one = run_impl<T>(impl, c, options);
            for (int threads : {2, 3, 4}) {
                options.num_threads = threads;
                if (Verdict v = bitwise_equal(c, one, run_impl<T>(impl, c, options),
                                              "1 thread vs " + std::to_string(threads) + " threads"))
                    return v;
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
