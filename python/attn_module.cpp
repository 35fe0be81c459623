// attn._attn: the Python module's compiled half (pybind11). NumPy arrays cross without copies where their strides
// are whole elements; attn/__init__.py converts PyTorch tensors and gives the functions their documented signatures.
//
//   sdpa, sdpa_backward   the library's forward (with weights, lse) and backward on arrays
//   oracle, check         the oracle on arrays: exact results, bounds, verdicts (check_gradients: dq, dk, dv)
//   serve                 runs `attn properties --kernel-connection ...` and answers its forward calls with a Python
//                         callable, through the same protocol as a kernel library's worker (plugin/src/protocol.hpp)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <type_traits>
#include <string_view>
#include <vector>

#include "attn/backward.hpp"
#include "attn/error.hpp"
#include "attn/half.hpp"
#include "attn/kernel_abi.h"
#include "attn/oracle/backward.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#include "attn/sdpa.hpp"
#include "attn/options.hpp"
#include "protocol.hpp"

namespace py = pybind11;

namespace {

using attn::Index;
using attn::Shape;

// The element types the calls compute in. float16 comes as NumPy's float16; bfloat16, which NumPy lacks, as the
// int16 (or uint16) bits of each element, as attn/__init__.py gets them from a torch.bfloat16 tensor
// (tensor.view(torch.int16)) and as `attn check --dtype bfloat16` reads them; float16 bits are taken that way too.
template <class T>
constexpr const char* dtype_name() {
    if constexpr (std::is_same_v<T, float>) return "float32";
    else if constexpr (std::is_same_v<T, double>) return "float64";
    else if constexpr (std::is_same_v<T, attn::float16>) return "float16";
    else return "bfloat16";
}

bool is_bits16(const py::array& a) { return a.dtype().kind() == 'i' || a.dtype().kind() == 'u'; }

// Whether array a holds elements of T: exactly T for float32, float64 and bool (no silent conversion: a float64 array is no
// float32 input), NumPy's float16 or 16-bit integers (the bits) for float16, 16-bit integers for bfloat16.
template <class T>
bool holds(const py::array& a) {
    if constexpr (!std::is_same_v<T, attn::float16> && !std::is_same_v<T, attn::bfloat16>) {
        return a.dtype().is(py::dtype::of<T>());
    } else {
        if (a.dtype().itemsize() != 2) return false;
        return is_bits16(a) || (std::is_same_v<T, attn::float16> && a.dtype().kind() == 'f');
    }
}

// A zero-copy view of a NumPy array of elements of T (holds<T>).
template <class T>
attn::TensorView<const T> view_of(const py::array& a, const std::string& function, const char* name) {
    if (!holds<T>(a))
        throw attn::ConfigError(function + ": " + name + " is " + std::string(py::str(a.dtype())) + ", expected " +
                                dtype_name<T>() + " like q" +
                                (std::is_same_v<T, attn::bfloat16> ? " (as its int16 bits)" : ""));
    Shape shape(static_cast<std::size_t>(a.ndim())), strides(shape.size());
    for (py::ssize_t d = 0; d < a.ndim(); ++d) {
        shape[static_cast<std::size_t>(d)] = a.shape(d);
        if (a.strides(d) % static_cast<py::ssize_t>(sizeof(T)) != 0)
            throw attn::ConfigError(function + ": " + name + " has a stride that is no whole number of elements");
        strides[static_cast<std::size_t>(d)] = a.strides(d) / static_cast<py::ssize_t>(sizeof(T));
    }
    return attn::TensorView<const T>(static_cast<const T*>(a.data()), shape, strides);
}

// A copy as a NumPy array: float16 as NumPy's float16, bfloat16 as its int16 bits (the package makes a
// torch.bfloat16 tensor of them where the inputs were tensors).
template <class T>
py::array to_numpy(const attn::Tensor<T>& t) {
    std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
    py::dtype dtype = std::is_same_v<T, attn::float16>    ? py::dtype("float16")
                      : std::is_same_v<T, attn::bfloat16> ? py::dtype::of<std::int16_t>()
                                                          : py::dtype::of<T>();
    py::array out(dtype, shape);
    std::memcpy(out.mutable_data(), t.data(), static_cast<std::size_t>(t.numel()) * sizeof(T));
    return out;
}

std::optional<attn::TensorView<const bool>> mask_of(const std::optional<py::array>& m, const std::string& function) {
    if (!m) return std::nullopt;
    if (!m->dtype().is(py::dtype::of<bool>()))
        throw attn::ConfigError(function + ": the mask must be bool (True = may attend), got " + std::string(py::str(m->dtype())));
    return view_of<bool>(*m, function, "mask");
}

// The options of a call, from the Python keywords (the option table's python names, attn/options.hpp); what a
// call does not name keeps AttentionOptions' default. The bias and the slopes are views of the arrays held here.
struct Problem {
    attn::AttentionOptions base;
    std::optional<py::array> bias, alibi_slopes;  // of q's dtype (view_of refuses another)
    template <class T>
    attn::SdpaOptions options(const std::string& function) const {
        attn::SdpaOptions o;
        static_cast<attn::AttentionOptions&>(o) = base;
        if (bias) o.bias = view_of<T>(*bias, function, "bias");
        if (alibi_slopes) o.alibi_slopes = view_of<T>(*alibi_slopes, function, "alibi_slopes");
        return o;
    }
};

template <class V>
V keyword_value(const py::handle& value, const std::string& function, const std::string& name, const char* what) {
    try {
        return value.cast<V>();
    } catch (const py::cast_error&) {
        throw attn::ConfigError(function + ": " + name + " must be " + what + ", got " +
                                std::string(py::str(value.get_type().attr("__name__"))));
    }
}

// The keywords of a call: attn.oracle and attn.check take the problem's options (attn::problem_option_fields),
// attn.sdpa the library's execution options too. None keeps an option's default.
Problem problem_of(const py::dict& keywords, const std::string& function, bool library_call) {
    std::vector<std::string_view> fields(std::begin(attn::problem_option_fields), std::end(attn::problem_option_fields));
    if (library_call)
        fields.insert(fields.end(), std::begin(attn::execution_option_fields), std::end(attn::execution_option_fields));
    std::vector<std::string> known;
    for (const std::string_view field : fields) known.emplace_back(attn::option_spec(field).python);
    Problem p;
    attn::AttentionOptions& o = p.base;
    std::optional<std::pair<long long, long long>> window;
    std::string window_alignment = attn::to_string(attn::SlidingWindow{}.alignment);
    for (const auto& [key, value] : keywords) {
        const std::string name = py::str(key);
        std::size_t i = 0;
        while (i < known.size() && name != known[i]) ++i;
        if (i == known.size()) {
            std::string list;
            for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
            throw attn::ConfigError(function + ": unknown option '" + name + "' (its options: " + list + ")");
        }
        const std::string_view field = fields[i];
        if (value.is_none()) continue;
        if (field == "scale") o.scale = keyword_value<double>(value, function, name, "a float or None");
        else if (field == "is_causal") {
            o.is_causal = true;
            o.alignment = attn::parse_spelling<attn::CausalAlignment>(
                keyword_value<std::string>(value, function, name, "a str or None"), function, name);
        } else if (field == "window")
            window = keyword_value<std::pair<long long, long long>>(value, function, name, "(left, right) or None");
        else if (field == "window.alignment")
            window_alignment = keyword_value<std::string>(value, function, name, "a str");
        else if (field == "softcap") o.softcap = keyword_value<double>(value, function, name, "a float");
        else if (field == "bias") p.bias = keyword_value<py::array>(value, function, name, "an array or None");
        else if (field == "alibi_slopes") p.alibi_slopes = keyword_value<py::array>(value, function, name, "an array or None");
        else if (field == "empty_rows")
            o.empty_rows = attn::parse_spelling<attn::EmptyRowPolicy>(
                keyword_value<std::string>(value, function, name, "a str"), function, name);
        else if (field == "check_finite") o.check_finite = keyword_value<bool>(value, function, name, "a bool");
        else if (field == "backend")
            o.backend = attn::parse_spelling<attn::Backend>(keyword_value<std::string>(value, function, name, "a str"),
                                                            function, name);
        else if (field == "num_threads") o.num_threads = keyword_value<int>(value, function, name, "an int");
    }
    const attn::CausalAlignment side = attn::parse_spelling<attn::CausalAlignment>(window_alignment, function,
                                                                                   "window_alignment");
    if (window) o.window = attn::SlidingWindow{window->first, window->second, side};
    return p;
}

// The option table, for the package's docstrings: one dict per row with a Python keyword.
py::list option_table() {
    py::list rows;
    for (const attn::OptionSpec& o : attn::option_table()) {
        if (*o.python == '\0') continue;
        py::dict row;
        row["field"] = o.field;
        row["python"] = o.python;
        row["cli"] = o.cli;
        row["default"] = o.default_text;
        row["help"] = o.help;
        rows.append(row);
    }
    return rows;
}

// f.template operator()<T>() for the element type of q: its dtype, or with 16-bit integers the `dtype` the call
// names ("bfloat16" or "float16": the bits of that type). The one dispatch of every call.
template <class F>
decltype(auto) with_dtype(const py::array& q, const std::string& dtype, const std::string& function, F&& f) {
    const std::string got = py::str(q.dtype());
    if (!dtype.empty() && dtype != "bfloat16" && dtype != "float16")
        throw attn::ConfigError(function + ": dtype must be 'bfloat16' or 'float16' (the type whose bits 16-bit "
                                "integer inputs are), got '" + dtype + "'");
    if (!dtype.empty() && !is_bits16(q) && !(dtype == "float16" && holds<attn::float16>(q)))
        throw attn::ConfigError(function + ": dtype='" + dtype + "' reads 16-bit integer inputs as its bits, but q is " +
                                got);
    if (q.dtype().is(py::dtype::of<float>())) return f.template operator()<float>();
    if (q.dtype().is(py::dtype::of<double>())) return f.template operator()<double>();
    if (holds<attn::float16>(q) && (q.dtype().kind() == 'f' || dtype == "float16"))
        return f.template operator()<attn::float16>();
    if (holds<attn::bfloat16>(q) && dtype == "bfloat16") return f.template operator()<attn::bfloat16>();
    if (holds<attn::bfloat16>(q))
        throw attn::ConfigError(function + ": q is " + got + ": the bits of a 16-bit type? Say which with "
                                "dtype='bfloat16' or dtype='float16' (a torch.bfloat16 tensor needs neither)");
    throw attn::ConfigError(function + ": q must be float32, float64, float16 or bfloat16, got " + got);
}

// The output; with return_weights or return_lse a tuple (output, weights if asked, lse if asked).
template <class T>
py::object sdpa_t(const py::array& q, const py::array& k, const py::array& v, const std::optional<py::array>& mask,
                  const Problem& problem, bool return_weights, bool return_lse) {
    const std::string fn = "attn.sdpa";
    attn::SdpaOptions o = problem.options<T>(fn);
    o.return_weights = return_weights;
    o.return_lse = return_lse;
    const auto r = attn::scaled_dot_product_attention(view_of<T>(q, fn, "q"), view_of<T>(k, fn, "k"), view_of<T>(v, fn, "v"),
                                                      mask_of(mask, fn), o);
    if (!return_weights && !return_lse) return to_numpy(r.output);
    py::list parts;
    parts.append(to_numpy(r.output));
    if (return_weights) parts.append(r.weights ? py::object(to_numpy(*r.weights)) : py::none());
    if (return_lse) parts.append(to_numpy(*r.lse));
    return py::tuple(parts);
}

// attn::sdpa_backward: (dq, dk, dv) from the forward's out and lse (its return_lse) and dout.
template <class T>
py::tuple sdpa_backward_t(const py::array& q, const py::array& k, const py::array& v, const py::array& out,
                          const py::array& lse, const py::array& dout, const std::optional<py::array>& mask,
                          const Problem& problem) {
    const std::string fn = "attn.sdpa_backward";
    using C = attn::compute_t<T>;
    const auto g = attn::sdpa_backward(view_of<T>(q, fn, "q"), view_of<T>(k, fn, "k"), view_of<T>(v, fn, "v"),
                                       view_of<T>(out, fn, "out"), view_of<C>(lse, fn, "lse"),
                                       view_of<T>(dout, fn, "dout"), mask_of(mask, fn), problem.options<T>(fn));
    return py::make_tuple(to_numpy(g.dq), to_numpy(g.dk), to_numpy(g.dv));
}

// The error model a check's bound is for: a named one (oracle::model_by_name) and, for 16-bit kernels, where the
// kernel rounds to storage inside the computation (ErrorModel::logit_storage_roundings, probabilities_in_storage;
// `attn check --logit-storage-roundings`, `--probabilities-in-storage`).
struct ModelChoice {
    std::string name = "generic";
    Index key_block = 64;
    Index logit_storage_roundings = 0;
    bool probabilities_in_storage = false;
    attn::oracle::OracleOptions oracle_options(bool statistical = false) const {
        attn::oracle::OracleOptions oo;
        oo.model = attn::oracle::model_by_name(name, key_block);
        oo.model.logit_storage_roundings = logit_storage_roundings;
        oo.model.probabilities_in_storage = probabilities_in_storage;
        oo.statistical = statistical;
        return oo;
    }
};

ModelChoice model_of(const std::string& name, Index key_block, Index logit_storage_roundings,
                     bool probabilities_in_storage, const std::string& function) {
    if (logit_storage_roundings < 0 || logit_storage_roundings > 2)
        throw attn::ConfigError(function + ": logit_storage_roundings must be 0, 1 or 2, got " +
                                std::to_string(logit_storage_roundings));
    return {name, key_block, logit_storage_roundings, probabilities_in_storage};
}

template <class T>
attn::oracle::Result<T> oracle_t(const std::string& fn, const py::array& q, const py::array& k, const py::array& v,
                                 const std::optional<py::array>& mask, const Problem& problem, const ModelChoice& model,
                                 bool statistical) {
    const attn::oracle::OracleOptions oo = model.oracle_options(statistical);
    return attn::oracle::scaled_dot_product_attention<T>(view_of<T>(q, fn, "q"), view_of<T>(k, fn, "k"), view_of<T>(v, fn, "v"),
                                                         mask_of(mask, fn), problem.options<T>(fn), oo);
}

py::dict comparison_dict(const attn::oracle::Comparison& c) {
    py::dict d;
    d["elements"] = c.elements;
    d["violations"] = c.violations;
    d["unbounded"] = c.unbounded;
    d["nonfinite_mismatches"] = c.nonfinite_mismatches;
    d["max_ulp"] = c.max_ulp;
    d["max_abs"] = c.max_abs;
    d["max_rel"] = c.max_rel;
    d["tightness"] = c.max_tightness;
    d["worst_index"] = py::tuple(py::cast(c.worst_index));
    d["worst_computed"] = c.worst_computed;
    d["worst_exact"] = c.worst_exact;
    d["worst_bound"] = c.worst_bound;
    d["summary"] = c.summary();
    return d;
}

template <class T>
py::dict check_t(const py::array& q, const py::array& k, const py::array& v, const py::array& out,
                 const std::optional<py::array>& mask, const Problem& problem, const ModelChoice& model) {
    const std::string fn = "attn.check";
    const attn::oracle::Result<T> r = oracle_t<T>(fn, q, k, v, mask, problem, model, true);
    const attn::TensorView<const T> candidate = view_of<T>(out, fn, "out");
    if (candidate.shape() != r.output.shape())
        throw attn::ShapeError(fn + ": out is " + attn::to_string(candidate.shape()) + " but the output of q, k, v is " +
                               attn::to_string(r.output.shape()));
    const attn::oracle::CheckVerdict verdict = attn::oracle::check_candidate<T>(candidate, r, std::nullopt);
    py::dict d = comparison_dict(verdict.output);
    d["passed"] = verdict.pass();
    d["suspicious"] = verdict.suspicious();
    d["model"] = r.model.name;
    d["dtype"] = dtype_name<T>();
    d["oracle_bits"] = r.bits;
    return d;
}

// The gradients of sum(dout * output) a kernel gave (any of dq, dk, dv; None for one not given) against the
// oracle's exact ones and their bound for a backward of `model` (`attn check --dout`, oracle/BOUNDS.md section 12).
template <class T>
py::dict check_gradients_t(const py::array& q, const py::array& k, const py::array& v, const py::array& dout,
                           const std::optional<py::array>& dq, const std::optional<py::array>& dk,
                           const std::optional<py::array>& dv, const std::optional<py::array>& mask,
                           const Problem& problem, const ModelChoice& model) {
    const std::string fn = "attn.check";
    const attn::oracle::OracleOptions oo = model.oracle_options();
    const attn::oracle::Gradients<T> g =
        attn::oracle::sdpa_backward<T>(view_of<T>(q, fn, "q"), view_of<T>(k, fn, "k"), view_of<T>(v, fn, "v"),
                                       view_of<T>(dout, fn, "dout"), mask_of(mask, fn), problem.options<T>(fn), oo);
    py::dict d;
    bool passed = true;
    const std::pair<const std::optional<py::array>*, attn::oracle::Gradient> given[] = {
        {&dq, attn::oracle::Gradient::Dq}, {&dk, attn::oracle::Gradient::Dk}, {&dv, attn::oracle::Gradient::Dv}};
    for (const auto& [candidate, which] : given) {
        if (!*candidate) continue;
        const char* name = attn::oracle::gradient_name(which);
        const attn::oracle::Comparison c = attn::oracle::compare_gradient<T>(view_of<T>(**candidate, fn, name), g, which);
        py::dict one = comparison_dict(c);
        one["passed"] = c.pass();
        passed = passed && c.pass();
        d[name] = one;
    }
    d["passed"] = passed;
    d["model"] = g.model.name;
    d["dtype"] = dtype_name<T>();
    d["oracle_bits"] = g.bits;
    return d;
}

// ---- serve: a Python callable as a kernel worker ----------------------------------------------------------------

void copy_into(char* to, std::size_t size, const std::string& from) {
    const std::size_t n = std::min(size - 1, from.size());
    std::memcpy(to, from.data(), n);
    to[n] = '\0';
}

py::array region_view(char* region, const attn::plugin::wire::TensorRef& ref, const py::dtype& dtype, py::handle base) {
    std::vector<py::ssize_t> shape(ref.shape, ref.shape + 4), strides(4);
    for (int d = 0; d < 4; ++d) strides[static_cast<std::size_t>(d)] = ref.strides[d] * dtype.itemsize();
    return py::array(dtype, shape, strides, region + ref.offset, base);
}

int serve(py::function fn, py::dict declaration, const std::string& program, const std::vector<std::string>& args,
          const std::vector<std::string>& env) {
    namespace wire = attn::plugin::wire;
    wire::Hello hello;
    hello.abi_version = ATTN_KERNEL_ABI_VERSION;
    copy_into(hello.name, sizeof hello.name, py::cast<std::string>(declaration["name"]));
    copy_into(hello.version, sizeof hello.version, py::cast<std::string>(declaration["version"]));
    copy_into(hello.description, sizeof hello.description, py::cast<std::string>(declaration["description"]));
    copy_into(hello.error_model, sizeof hello.error_model, py::cast<std::string>(declaration["error_model"]));
    hello.dtypes = py::cast<std::uint32_t>(declaration["dtypes"]);
    hello.masks = py::cast<std::uint32_t>(declaration["masks"]);
    hello.empty_rows = py::cast<std::uint32_t>(declaration["empty_rows"]);
    hello.gqa = py::cast<bool>(declaration["gqa"]);
    hello.strided = py::cast<bool>(declaration["strided"]);
    hello.weights = 0;
    hello.max_dk = py::cast<std::int64_t>(declaration["max_dk"]);
    hello.max_dv = py::cast<std::int64_t>(declaration["max_dv"]);
    hello.key_block = py::cast<std::int64_t>(declaration["key_block"]);
    hello.exp_ulps = py::cast<double>(declaration["exp_ulps"]);
    const bool pass_policy = hello.empty_rows == (ATTN_KERNEL_EMPTY_ZERO | ATTN_KERNEL_EMPTY_NAN);
    py::object unsupported = declaration["unsupported"];

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) throw std::runtime_error(std::string("socketpair: ") + std::strerror(errno));
    const int memfd = memfd_create("attn-python-kernel", MFD_CLOEXEC);
    if (memfd < 0) throw std::runtime_error(std::string("memfd_create: ") + std::strerror(errno));
    const int child_socket = std::max(sv[1], memfd) + 1, child_memfd = child_socket + 1;
    std::vector<std::string> argv_s = {program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    argv_s.push_back("--kernel-connection");
    argv_s.push_back(std::to_string(child_socket) + "," + std::to_string(child_memfd));
    std::vector<char*> argv, envp;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s = env;
    for (std::string& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], child_socket);
    posix_spawn_file_actions_adddup2(&actions, memfd, child_memfd);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        close(memfd);
        throw std::runtime_error("attn.properties: cannot start " + program + ": " + std::strerror(rc));
    }
    const int sock = sv[0];
    const auto finish = [&](bool kill_it) {
        close(sock);
        if (kill_it) kill(pid, SIGKILL);
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        close(memfd);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    };
    send(sock, &hello, sizeof hello, MSG_NOSIGNAL);

    py::module_ numpy = py::module_::import("numpy");
    char* region = nullptr;
    std::uint64_t mapped = 0;
    for (;;) {
        pollfd pfd{sock, POLLIN, 0};
        const int ready = poll(&pfd, 1, 200);
        if (ready == 0 || (ready < 0 && errno == EINTR)) {
            if (PyErr_CheckSignals() != 0) {  // Ctrl-C: stop attn, and let Python raise
                if (region) munmap(region, mapped);
                finish(true);
                throw py::error_already_set();
            }
            continue;
        }
        wire::Request request;
        const ssize_t n = recv(sock, &request, sizeof request, 0);
        if (n <= 0) break;  // attn is done
        if (n != static_cast<ssize_t>(sizeof request) || request.magic != wire::kMagic) break;
        if (request.region_bytes != mapped) {
            if (region) munmap(region, mapped);
            void* p = mmap(nullptr, request.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
            if (p == MAP_FAILED) break;
            region = static_cast<char*>(p);
            mapped = request.region_bytes;
        }
        wire::Reply reply;
        try {
            const py::dtype dtype = request.bits == 32 ? py::dtype::of<float>() : py::dtype::of<double>();
            // The views live as long as this call: the region is remapped when a later call needs more room.
            py::array q = region_view(region, request.q, dtype, py::none());
            py::array k = region_view(region, request.k, dtype, py::none());
            py::array v = region_view(region, request.v, dtype, py::none());
            py::array out = region_view(region, request.out, dtype, py::none());
            py::object mask = py::none();
            if (request.mask.offset >= 0) mask = region_view(region, request.mask, py::dtype::of<bool>(), py::none());
            py::dict kw;
            kw["mask"] = mask;
            kw["causal"] = request.causal == ATTN_KERNEL_CAUSAL_TL   ? py::object(py::str("top-left"))
                           : request.causal == ATTN_KERNEL_CAUSAL_BR ? py::object(py::str("bottom-right"))
                                                                     : py::object(py::none());
            kw["scale"] = request.scale;
            if (pass_policy) kw["empty_rows"] = request.empty_rows == ATTN_KERNEL_EMPTY_NAN ? "nan" : "zero";
            py::object result = numpy.attr("asarray")(fn(q, k, v, **kw));
            py::array got = result.cast<py::array>();
            const std::string expected = std::string(py::str(out.dtype())) + " " + std::string(py::str(py::tuple(out.attr("shape"))));
            const std::string returned = std::string(py::str(got.dtype())) + " " + std::string(py::str(py::tuple(got.attr("shape"))));
            if (!got.dtype().is(out.dtype()) || !py::tuple(got.attr("shape")).equal(py::tuple(out.attr("shape")))) {
                reply.status = ATTN_KERNEL_FAILED;
                copy_into(reply.message, sizeof reply.message, "returned " + returned + "; expected " + expected);
            } else {
                numpy.attr("copyto")(out, got);
                reply.status = ATTN_KERNEL_OK;
            }
        } catch (py::error_already_set& e) {
            if (e.matches(PyExc_KeyboardInterrupt)) {
                if (region) munmap(region, mapped);
                finish(true);
                throw;
            }
            // The exception's type and text, without the traceback (the reason is counted or shown in one line).
            const bool declined = e.matches(unsupported);
            reply.status = declined ? ATTN_KERNEL_UNSUPPORTED : ATTN_KERNEL_FAILED;
            const std::string text = py::str(e.value());
            copy_into(reply.message, sizeof reply.message,
                      declined ? text : "raised " + std::string(py::str(e.type().attr("__name__"))) + ": " + text);
        }
        if (send(sock, &reply, sizeof reply, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof reply)) break;
    }
    if (region) munmap(region, mapped);
    return finish(false);
}

}  // namespace

PYBIND11_MODULE(_attn, m) {
    m.doc() = "attn's compiled half; use the attn package";
    static py::exception<attn::Error> error(m, "Error", PyExc_ValueError);
    static py::exception<attn::ShapeError> shape_error(m, "ShapeError", error.ptr());
    static py::exception<attn::MaskError> mask_error(m, "MaskError", error.ptr());
    static py::exception<attn::ValueError> value_error(m, "ValueError", error.ptr());
    static py::exception<attn::ConfigError> config_error(m, "ConfigError", error.ptr());
    // The library's messages with their remedies in Python's terms (empty_rows='zero', check_finite=False).
    py::register_exception_translator([](std::exception_ptr thrown) {
        const auto raise = [](const py::object& type, const attn::Error& e) {
            PyErr_SetString(type.ptr(), e.message(attn::Interface::Python).c_str());
        };
        try {
            if (thrown) std::rethrow_exception(thrown);
        } catch (const attn::ShapeError& e) {
            raise(shape_error, e);
        } catch (const attn::MaskError& e) {
            raise(mask_error, e);
        } catch (const attn::ValueError& e) {
            raise(value_error, e);
        } catch (const attn::ConfigError& e) {
            raise(config_error, e);
        } catch (const attn::Error& e) {
            raise(error, e);
        }
    });
    m.attr("ATTN_PROGRAM") = ATTN_PROGRAM;
    m.attr("KERNEL_ABI_VERSION") = ATTN_KERNEL_ABI_VERSION;

    // The keywords of every call are the option table's (attn/options.hpp); the package passes them as a dict.
    m.def("option_table", &option_table);
    m.def("sdpa", [](const py::array& q, const py::array& k, const py::array& v, std::optional<py::array> mask,
                     bool return_weights, bool return_lse, const py::dict& options, const std::string& dtype) {
        const Problem p = problem_of(options, "attn.sdpa", true);
        return with_dtype(q, dtype, "attn.sdpa",
                          [&]<class T>() { return sdpa_t<T>(q, k, v, mask, p, return_weights, return_lse); });
    });
    m.def("sdpa_backward", [](const py::array& q, const py::array& k, const py::array& v, const py::array& out,
                              const py::array& lse, const py::array& dout, std::optional<py::array> mask,
                              const py::dict& options, const std::string& dtype) {
        const Problem p = problem_of(options, "attn.sdpa_backward", true);
        return with_dtype(q, dtype, "attn.sdpa_backward",
                          [&]<class T>() { return sdpa_backward_t<T>(q, k, v, out, lse, dout, mask, p); });
    });
    m.def("oracle", [](const py::array& q, const py::array& k, const py::array& v, std::optional<py::array> mask,
                       const std::string& model, Index key_block, Index logit_storage_roundings,
                       bool probabilities_in_storage, const py::dict& options, const std::string& dtype) {
        const std::string fn = "attn.oracle";
        const Problem p = problem_of(options, fn, false);
        const ModelChoice mc = model_of(model, key_block, logit_storage_roundings, probabilities_in_storage, fn);
        return with_dtype(q, dtype, fn, [&]<class T>() {
            const attn::oracle::Result<T> r = oracle_t<T>(fn, q, k, v, mask, p, mc, false);
            py::dict d;
            d["output"] = to_numpy(r.output);
            d["bound"] = to_numpy(r.output_bound);
            d["weights"] = to_numpy(r.weights);
            d["weights_bound"] = to_numpy(r.weights_bound);
            d["model"] = r.model.name;
            d["bits"] = r.bits;
            d["dtype"] = dtype_name<T>();
            return d;
        });
    });
    m.def("check", [](const py::array& q, const py::array& k, const py::array& v, const py::array& out,
                      std::optional<py::array> mask, const std::string& model, Index key_block,
                      Index logit_storage_roundings, bool probabilities_in_storage, const py::dict& options,
                      const std::string& dtype) {
        const std::string fn = "attn.check";
        const Problem p = problem_of(options, fn, false);
        const ModelChoice mc = model_of(model, key_block, logit_storage_roundings, probabilities_in_storage, fn);
        return with_dtype(q, dtype, fn, [&]<class T>() { return check_t<T>(q, k, v, out, mask, p, mc); });
    });
    m.def("check_gradients", [](const py::array& q, const py::array& k, const py::array& v, const py::array& dout,
                                std::optional<py::array> dq, std::optional<py::array> dk, std::optional<py::array> dv,
                                std::optional<py::array> mask, const std::string& model, Index key_block,
                                Index logit_storage_roundings, bool probabilities_in_storage,
                                const py::dict& options, const std::string& dtype) {
        const std::string fn = "attn.check";
        const Problem p = problem_of(options, fn, false);
        const ModelChoice mc = model_of(model, key_block, logit_storage_roundings, probabilities_in_storage, fn);
        return with_dtype(q, dtype, fn,
                          [&]<class T>() { return check_gradients_t<T>(q, k, v, dout, dq, dk, dv, mask, p, mc); });
    });
    m.def("serve", &serve);
}
