// Shape helpers shared by every tensor view.
#include "attn/tensor.hpp"

namespace attn {

std::string to_string(std::span<const Index> shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ",";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

Index numel(std::span<const Index> shape) {
    // Sizes come from files and fuzzers too: a product that wraps would size a buffer too small.
    Index n = 1;
    for (Index s : shape)
        if (__builtin_mul_overflow(n, s, &n))
            throw ShapeError("numel: shape " + to_string(shape) + " has more elements than int64 can count");
    return n;
}

Shape contiguous_strides(std::span<const Index> shape) {
    Shape strides(shape.size(), 1);
    Index acc = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
        strides[d] = acc;
        if (__builtin_mul_overflow(acc, std::max<Index>(shape[d], 1), &acc))
            throw ShapeError("contiguous_strides: strides of shape " + to_string(shape) + " overflow int64");
    }
    return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& context, const std::string& a_name,
                       const std::string& b_name) {
    const std::size_t r = std::max(a.size(), b.size());
    Shape out(r, 1);
    for (std::size_t i = 0; i < r; ++i) {
        const Index da = i < r - a.size() ? 1 : a[i - (r - a.size())];
        const Index db = i < r - b.size() ? 1 : b[i - (r - b.size())];
        if (da == db || db == 1) {
            out[i] = da;
        } else if (da == 1) {
            out[i] = db;
        } else {
            throw ShapeError(context + ": " + a_name + " " + to_string(a) + " and " + b_name + " " + to_string(b) +
                             " do not broadcast");
        }
    }
    return out;
}

}  // namespace attn
