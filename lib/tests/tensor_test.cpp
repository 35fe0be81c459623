// Tensor views and owning tensors: strides, views without copies, broadcasting, copies, size overflow.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "attn/tensor.hpp"
#include "error_message.hpp"

using namespace attn;
using Catch::Contains;

TEST_CASE("shapes print as [a,b,c] and have C-order strides", "[tensor]") {
    CHECK(to_string(Shape{2, 4, 5, 64}) == "[2,4,5,64]");
    CHECK(to_string(Shape{}) == "[]");
    CHECK(numel(Shape{}) == 1);
    CHECK(numel(Shape{2, 0, 3}) == 0);
    CHECK(contiguous_strides(Shape{2, 3, 4}) == Shape{12, 4, 1});
    // A zero extent must not zero the strides of the dims before it.
    CHECK(contiguous_strides(Shape{2, 0, 4}) == Shape{4, 4, 1});
}

TEST_CASE("element counts and strides that overflow int64 are ShapeErrors", "[tensor][errors]") {
    const Index big = Index{1} << 40;
    const std::string m = test::error_message<ShapeError>([&] { (void)numel(Shape{big, big}); });
    CHECK_THAT(m, Contains("numel") && Contains("[1099511627776,1099511627776]"));
    test::error_message<ShapeError>([&] { (void)contiguous_strides(Shape{0, big, big}); });
    test::error_message<ShapeError>([&] { Tensor<float> t({big, big}); });
}

TEST_CASE("broadcast_shapes follows NumPy and names both tensors when it cannot", "[tensor]") {
    CHECK(broadcast_shapes({2, 1, 5}, {3, 1}, "f", "a", "b") == Shape{2, 3, 5});
    CHECK(broadcast_shapes({}, {4}, "f", "a", "b") == Shape{4});
    CHECK(broadcast_shapes({0}, {1}, "f", "a", "b") == Shape{0});
    const std::string m = test::error_message<ShapeError>([] { broadcast_shapes({2, 3}, {4, 3}, "fn", "left", "right"); });
    CHECK_THAT(m, Contains("fn") && Contains("left [2,3]") && Contains("right [4,3]"));
}

TEST_CASE("transpose, slice, unsqueeze and broadcast_to address the right elements without copies", "[tensor]") {
    Tensor<int> t({2, 3}, {0, 1, 2, 3, 4, 5});
    const auto tr = t.view().transpose(0, 1);  // (3, 2)
    CHECK(tr.shape() == Shape{3, 2});
    CHECK(tr({2, 1}) == 5);
    CHECK(tr({1, 0}) == 1);
    CHECK(tr.data() == t.data());
    CHECK_FALSE(tr.is_contiguous());

    const auto sl = t.view().slice(1, 1, 3);  // (2, 2): columns 1 and 2
    CHECK(sl.shape() == Shape{2, 2});
    CHECK(sl({0, 0}) == 1);
    CHECK(sl({1, 1}) == 5);
    CHECK(t.view().slice(0, 2, 2).numel() == 0);
    const std::string m = test::error_message<ShapeError>([&] { (void)t.view().slice(1, 2, 4); });
    CHECK_THAT(m, Contains("slice") && Contains("[2,3]"));

    const auto un = t.view().unsqueeze(1);  // (2, 1, 3)
    CHECK(un.shape() == Shape{2, 1, 3});
    CHECK(un({1, 0, 2}) == 5);

    const auto row = t.view().slice(0, 1, 2);                // (1, 3)
    const auto bc = row.broadcast_to({4, 2, 3}, "f", "row");  // (4, 2, 3), stride 0 on dims 0 and 1
    CHECK(bc.strides() == Shape{0, 0, 1});
    CHECK(bc({3, 0, 2}) == 5);
    const std::string e = test::error_message<ShapeError>([&] { (void)t.view().broadcast_to({3, 3}, "fn", "t"); });
    CHECK_THAT(e, Contains("fn") && Contains("t [2,3]") && Contains("[3,3]"));
}

TEST_CASE("copy_of materialises any view in C order", "[tensor]") {
    const Tensor<double> t({2, 3}, {0, 1, 2, 3, 4, 5});
    const auto c = Tensor<double>::copy_of(t.view().transpose(0, 1));
    CHECK(c.shape() == Shape{3, 2});
    const double expected[] = {0, 3, 1, 4, 2, 5};
    for (Index i = 0; i < 6; ++i) CHECK(c[i] == expected[i]);
    const auto b = Tensor<double>::copy_of(t.view().slice(0, 0, 1).broadcast_to({2, 2, 3}, "f", "t"));
    CHECK(b.numel() == 12);
    CHECK(b[7] == 1.0);
}

TEST_CASE("owning tensors check their inputs and copy deeply", "[tensor]") {
    test::error_message<ShapeError>([] { Tensor<float> t({2, -1}); });
    const std::string m = test::error_message<ShapeError>([] { Tensor<float> t({2, 2}, {1, 2, 3}); });
    CHECK_THAT(m, Contains("3 values") && Contains("[2,2]"));
    Tensor<float> a({2}, {1, 2});
    Tensor<float> b = a;
    b[0] = 7;
    CHECK(a[0] == 1);
    // Copying a default-constructed tensor (no storage) must not read through a null pointer.
    const Tensor<float> none;
    const Tensor<float> none_copy = none;
    CHECK(none_copy.numel() == 0);
    CHECK(none_copy.data() == nullptr);
    const auto r = std::move(a).reshaped({2, 1});
    CHECK(r.shape() == Shape{2, 1});
    test::error_message<ShapeError>([&] { (void)Tensor<float>({3}).reshaped({2}); });
}
