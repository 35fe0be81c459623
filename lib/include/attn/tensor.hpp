// attn/tensor.hpp: strided tensor views (shape + strides, stride 0 = broadcast) and an owning tensor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/error.hpp"

namespace attn {

// All sizes and indices are 64-bit: sequence lengths past 65536 must not wrap.
using Index = std::int64_t;
using Shape = std::vector<Index>;

// "[2,4,5,64]": how shapes appear in every message.
std::string to_string(std::span<const Index> shape);
inline std::string to_string(const Shape& shape) { return to_string(std::span<const Index>(shape)); }

// Product of the extents (1 for rank 0); ShapeError when it does not fit int64.
Index numel(std::span<const Index> shape);

// Row-major (C order) strides, in elements.
Shape contiguous_strides(std::span<const Index> shape);

// NumPy broadcasting of two shapes (trailing dims aligned, 1 stretches).
// Throws ShapeError naming `context`, both tensors and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& context, const std::string& a_name,
                       const std::string& b_name);

// A non-owning view: data pointer, shape, strides in elements (may be 0 for broadcast dims).
template <class T>
class TensorView {
public:
    using value_type = std::remove_const_t<T>;

    TensorView() = default;
    TensorView(T* data, Shape shape, Shape strides) : data_(data), shape_(std::move(shape)), strides_(std::move(strides)) {
        if (shape_.size() != strides_.size()) throw ShapeError("TensorView: shape and strides differ in rank");
        for (Index s : shape_)
            if (s < 0) throw ShapeError("TensorView: negative extent in shape " + to_string(shape_));
    }
    TensorView(T* data, Shape shape) : TensorView(data, shape, contiguous_strides(shape)) {}

    // A view of const elements converts implicitly from a mutable one.
    template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
    TensorView(const TensorView<U>& other) : data_(other.data()), shape_(other.shape()), strides_(other.strides()) {}

    T* data() const { return data_; }
    const Shape& shape() const { return shape_; }
    const Shape& strides() const { return strides_; }
    Index rank() const { return static_cast<Index>(shape_.size()); }
    // Negative dims count from the end, as in NumPy.
    Index dim(Index d) const { return shape_[axis(d)]; }
    Index stride(Index d) const { return strides_[axis(d)]; }
    Index numel() const { return attn::numel(shape_); }
    bool empty() const { return numel() == 0; }

    bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }

    // Element at a full multi-index (no bounds checks on the hot path).
    T& at(std::span<const Index> idx) const {
        Index off = 0;
        for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides_[d];
        return data_[off];
    }
    T& operator()(std::initializer_list<Index> idx) const { return at(std::span<const Index>(idx.begin(), idx.size())); }

    // Swap two dims (no copy).
    TensorView transpose(Index a, Index b) const {
        TensorView r = *this;
        const std::size_t ia = axis(a), ib = axis(b);
        std::swap(r.shape_.at(ia), r.shape_.at(ib));
        std::swap(r.strides_.at(ia), r.strides_.at(ib));
        return r;
    }

    // Insert a size-1 dim at position d (0 <= d <= rank).
    TensorView unsqueeze(Index d) const {
        if (d < 0 || d > rank())
            throw ShapeError("TensorView::unsqueeze: position " + std::to_string(d) + " out of range for shape " +
                             to_string(shape_));
        TensorView r = *this;
        r.shape_.insert(r.shape_.begin() + d, 1);
        r.strides_.insert(r.strides_.begin() + d, 0);
        return r;
    }

    // Elements [begin, end) along dim d (no copy).
    TensorView slice(Index d, Index begin, Index end) const {
        TensorView r = *this;
        const std::size_t id = axis(d);
        if (begin < 0 || end < begin || end > shape_.at(id))
            throw ShapeError("TensorView::slice: range [" + std::to_string(begin) + "," + std::to_string(end) +
                             ") out of bounds for dim " + std::to_string(d) + " of shape " + to_string(shape_));
        r.data_ = shape_[id] == 0 ? data_ : data_ + begin * strides_[id];
        r.shape_[id] = end - begin;
        return r;
    }

    // NumPy broadcast_to: prepends dims and stretches size-1 dims with stride 0.
    TensorView broadcast_to(const Shape& target, const std::string& context, const std::string& name) const {
        const auto r = static_cast<std::size_t>(rank());
        if (r > target.size())
            throw ShapeError(context + ": " + name + " " + to_string(shape_) + " cannot broadcast to " + to_string(target));
        Shape strides(target.size(), 0);
        for (std::size_t i = 0; i < r; ++i) {
            const std::size_t t = target.size() - r + i;
            if (shape_[i] == target[t]) {
                strides[t] = strides_[i];
            } else if (shape_[i] == 1) {
                strides[t] = 0;
            } else {
                throw ShapeError(context + ": " + name + " " + to_string(shape_) + " cannot broadcast to " +
                                 to_string(target));
            }
        }
        return TensorView(data_, target, std::move(strides));
    }

private:
    // A dim index (negative counts from the end) as a position, or ShapeError when out of range.
    // The throw lives in a cold function so that dim(), stride() and axis() inline into hot loops.
    std::size_t axis(Index d) const {
        const Index a = d < 0 ? d + rank() : d;
        if (a < 0 || a >= rank()) [[unlikely]]
            throw_bad_axis(d);
        return static_cast<std::size_t>(a);
    }
    [[noreturn, gnu::cold, gnu::noinline]] void throw_bad_axis(Index d) const {
        throw ShapeError("TensorView: dim " + std::to_string(d) + " out of range for shape " + to_string(shape_));
    }

    T* data_ = nullptr;
    Shape shape_;
    Shape strides_;
};

// Calls f(multi_index) for every element of `shape`, last dim fastest.
template <class F>
void for_each_index(const Shape& shape, F&& f) {
    const Index n = numel(shape);
    if (n == 0) return;
    Shape idx(shape.size(), 0);
    for (Index i = 0; i < n; ++i) {
        f(std::span<const Index>(idx));
        for (std::size_t d = shape.size(); d-- > 0;) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}

// An owning, contiguous (C order) tensor. T is float, double, bool or an integer type.
template <class T>
class Tensor {
public:
    Tensor() = default;
    explicit Tensor(Shape shape, T fill = T{}) : Tensor(std::move(shape), Uninitialized{}) {
        std::fill_n(data_.get(), size_, fill);
    }
    // Storage left unwritten, for a kernel that writes every element before anything reads it (no pass over memory
    // that the kernel's own writes would repeat).
    static Tensor uninitialized(Shape shape) { return Tensor(std::move(shape), Uninitialized{}); }
    Tensor(Shape shape, std::initializer_list<T> values) : Tensor(std::move(shape)) {
        if (static_cast<Index>(values.size()) != size_)
            throw ShapeError("Tensor: " + std::to_string(values.size()) + " values for shape " + to_string(shape_));
        std::copy(values.begin(), values.end(), data_.get());
    }
    // A default-constructed tensor (no storage) copies to another one, not to a rank-0 tensor of one element.
    Tensor(const Tensor& o) : shape_(o.shape_), size_(o.size_) {
        if (!o.data_) return;
        data_ = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(size_));
        std::copy_n(o.data_.get(), size_, data_.get());
    }
    Tensor& operator=(const Tensor& o) {
        if (this != &o) *this = Tensor(o);
        return *this;
    }
    Tensor(Tensor&&) noexcept = default;
    Tensor& operator=(Tensor&&) noexcept = default;

    // A contiguous copy of any view (broadcast dims materialised).
    static Tensor copy_of(TensorView<const T> v) {
        Tensor t(v.shape());
        Index i = 0;
        for_each_index(v.shape(), [&](std::span<const Index> idx) { t.data_[static_cast<std::size_t>(i++)] = v.at(idx); });
        return t;
    }

    T* data() { return data_.get(); }
    const T* data() const { return data_.get(); }
    const Shape& shape() const { return shape_; }
    Index rank() const { return static_cast<Index>(shape_.size()); }
    Index dim(Index d) const { return view().dim(d); }
    Index numel() const { return size_; }
    T& operator[](Index i) { return data_[static_cast<std::size_t>(i)]; }
    const T& operator[](Index i) const { return data_[static_cast<std::size_t>(i)]; }
    T& operator()(std::initializer_list<Index> idx) { return view()(idx); }
    const T& operator()(std::initializer_list<Index> idx) const { return view()(idx); }

    TensorView<T> view() { return TensorView<T>(data_.get(), shape_); }
    TensorView<const T> view() const { return TensorView<const T>(data_.get(), shape_); }
    operator TensorView<const T>() const { return view(); }

    // Same elements, new shape of equal numel.
    Tensor reshaped(Shape shape) && {
        if (attn::numel(shape) != size_)
            throw ShapeError("Tensor::reshaped: cannot view " + to_string(shape_) + " as " + to_string(shape));
        shape_ = std::move(shape);
        return std::move(*this);
    }

private:
    struct Uninitialized {};
    Tensor(Shape shape, Uninitialized) : shape_(std::move(shape)) {
        for (Index s : shape_)
            if (s < 0) throw ShapeError("Tensor: negative extent in shape " + to_string(shape_));
        size_ = attn::numel(shape_);
        data_ = std::make_unique_for_overwrite<T[]>(static_cast<std::size_t>(size_));
    }

    Shape shape_{0};  // a default tensor is empty (rank 1, no elements), never a rank-0 scalar without storage
    Index size_ = 0;
    std::unique_ptr<T[]> data_;
};

}  // namespace attn
