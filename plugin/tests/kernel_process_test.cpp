// The host side of external kernels: loading refuses what is no kernel with a message naming the file and the
// rule; a call whose kernel crashes, hangs, writes outside its output or into its inputs, leaves output unwritten,
// declines or fails is reported as such, and the next call gets a fresh worker.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "attn/plugin/kernel_process.hpp"
#include "error_message.hpp"

namespace {

using attn::plugin::ForwardCall;
using attn::plugin::KernelDeclined;
using attn::plugin::KernelFailure;
using attn::plugin::KernelProcess;
using attn::plugin::LoadError;
using attn::test::error_message;

std::string kernel(const std::string& name) { return std::string(ATTN_TEST_KERNELS_DIR) + "/lib" + name + ".so"; }

// q, k, v and out all (1, 1, 2, 2) float32, dense.
struct SmallCall {
    std::vector<float> q{1, 2, 3, 4}, k{5, 6, 7, 8}, v{9, 10, 11, 12};
    std::vector<float> out = std::vector<float>(4, 0.0f);
    ForwardCall call;
    SmallCall() {
        const std::array<std::int64_t, 4> shape = {1, 1, 2, 2}, strides = {4, 4, 2, 1};
        call.bits = 32;
        call.q = {q.data(), q.size() * sizeof(float), shape, strides};
        call.k = {k.data(), k.size() * sizeof(float), shape, strides};
        call.v = {v.data(), v.size() * sizeof(float), shape, strides};
        call.out_shape = shape;
    }
};

std::string failure(KernelProcess& p) {
    SmallCall c;
    return error_message<KernelFailure>([&] { p.forward(c.call, c.out.data(), nullptr); });
}

}  // namespace

TEST_CASE("a well-behaved kernel is described and called", "[plugin]") {
    KernelProcess p(kernel("well_behaved"));
    CHECK(p.info().name == "well_behaved");
    CHECK(p.info().error_model == "generic");
    CHECK(p.info().capabilities().find("float32") != std::string::npos);
    SmallCall c;
    p.forward(c.call, c.out.data(), nullptr);
    CHECK(c.out == std::vector<float>(4, 1.0f));
    CHECK(p.restarts() == 0);
}

TEST_CASE("what is no kernel is refused when loading, naming the file and the rule", "[plugin]") {
    const std::string text = std::string(ATTN_TEST_KERNELS_DIR) + "/not_a_library.so";
    std::ofstream(text) << "not a shared object\n";
    CHECK_THAT(error_message<LoadError>([&] { KernelProcess p(text); }),
               Catch::Contains(text) && Catch::Contains("is not a loadable shared library"));
    CHECK_THAT(error_message<LoadError>([&] { KernelProcess p(kernel("missing_file")); }),
               Catch::Contains("missing_file") && Catch::Contains("No such file"));
    CHECK_THAT(error_message<LoadError>([&] { KernelProcess p(kernel("no_entry_point")); }),
               Catch::Contains("does not export attn_kernel_get"));
    CHECK_THAT(error_message<LoadError>([&] { KernelProcess p(kernel("wrong_abi")); }),
               Catch::Contains("ABI version 2; this attn speaks version 1"));
    CHECK_THAT(error_message<LoadError>([&] { KernelProcess p(kernel("bad_description")); }),
               Catch::Contains("breaks attn/kernel_abi.h") && Catch::Contains("'my kernel!'") &&
                   Catch::Contains("error_model must be generic, reference or tiled (got 'fast')"));
}

TEST_CASE("a kernel that crashes costs the call, and the next call gets a fresh worker", "[plugin]") {
    KernelProcess p(kernel("crashes"));
    CHECK_THAT(failure(p), Catch::Contains("kernel crashes crashed during the call with SIGSEGV"));
    CHECK_THAT(failure(p), Catch::Contains("SIGSEGV"));
    CHECK(p.restarts() == 1);
}

TEST_CASE("a kernel that hangs is stopped after the timeout, then after 1 s", "[plugin]") {
    KernelProcess p(kernel("hangs"), 0.5);
    CHECK_THAT(failure(p), Catch::Contains("kernel hangs did not return within 0.5 s"));
    CHECK(p.timeout_seconds() == 0.5);
    KernelProcess q(kernel("hangs"), 3.0);
    CHECK_THAT(failure(q), Catch::Contains("did not return within 3 s"));
    CHECK(q.timeout_seconds() == 1.0);
}

TEST_CASE("writes outside the output, into the inputs, and output left unwritten are caught", "[plugin]") {
    KernelProcess past(kernel("writes_past_end"));
    CHECK_THAT(failure(past), Catch::Contains("kernel writes_past_end wrote past the end of out"));
    KernelProcess before(kernel("writes_before_start"));
    CHECK_THAT(failure(before), Catch::Contains("wrote before the start of out"));
    KernelProcess input(kernel("writes_input"));
    CHECK_THAT(failure(input), Catch::Contains("wrote into its input k"));
    KernelProcess unwritten(kernel("leaves_unwritten"));
    CHECK_THAT(failure(unwritten), Catch::Contains("left out[0,0,1,1] unwritten"));
}

TEST_CASE("a kernel's own refusals come back with its message", "[plugin]") {
    KernelProcess declines(kernel("declines"));
    SmallCall c;
    CHECK_THAT(error_message<KernelDeclined>([&] { declines.forward(c.call, c.out.data(), nullptr); }),
               Catch::Equals("Dk = 2 is not a multiple of 8"));
    KernelProcess fails(kernel("fails"));
    CHECK_THAT(failure(fails), Catch::Contains("kernel fails returned ATTN_KERNEL_FAILED: workspace allocation failed"));
    CHECK(fails.restarts() == 0);  // an error is an answer: the worker lives on
}

TEST_CASE("a call with empty tensors passes no null pointer on (found by attn fuzz --kernel)", "[plugin]") {
    KernelProcess p(kernel("well_behaved"));
    ForwardCall call;
    const std::array<std::int64_t, 4> empty = {1, 1, 2, 0}, strides = {0, 0, 0, 1};
    call.q = {nullptr, 0, empty, strides};  // Dk = 0: no bytes, and a null pointer as std::vector gives them
    call.k = {nullptr, 0, empty, strides};
    std::vector<float> v{1, 2, 3, 4};
    call.v = {v.data(), v.size() * sizeof(float), {1, 1, 2, 2}, {4, 4, 2, 1}};
    call.out_shape = {1, 1, 2, 2};
    std::vector<float> out(4, 0.0f);
    p.forward(call, out.data(), nullptr);
    CHECK(out == std::vector<float>(4, 1.0f));
}
