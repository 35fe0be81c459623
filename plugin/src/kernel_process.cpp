// The host side of an external kernel: starting its worker, validating its description, laying out each call in
// shared memory and checking what the kernel did there.
#include "attn/plugin/kernel_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "attn/kernel_abi.h"
#include "protocol.hpp"

extern char** environ;

namespace attn::plugin {

namespace {

constexpr std::size_t kGuardBytes = 64;
constexpr unsigned char kGuardByte = 0xA5;
// Output elements start as a quiet NaN with this payload: one still there after the call was never written.
constexpr std::uint32_t kUnwrittenFloat = 0x7FCA77E1u;
constexpr std::uint64_t kUnwrittenDouble = 0x7FF8A77EA77EA77Eull;

std::size_t align_up(std::size_t n) { return (n + 63) / 64 * 64; }

std::string errno_text() { return std::strerror(errno); }

bool valid_name(const std::string& name) {
    return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
}

std::string signal_text(int sig) {
    const char* abbrev = sigabbrev_np(sig);
    const char* what = sigdescr_np(sig);
    return std::string("SIG") + (abbrev ? abbrev : std::to_string(sig)) + " (" + (what ? what : "unknown signal") + ")";
}

std::string dense_index(std::size_t flat, const std::array<std::int64_t, 4>& shape) {
    std::array<std::int64_t, 4> at{};
    for (int d = 3; d >= 0; --d) {
        at[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(flat) % std::max<std::int64_t>(1, shape[static_cast<std::size_t>(d)]);
        flat /= static_cast<std::size_t>(std::max<std::int64_t>(1, shape[static_cast<std::size_t>(d)]));
    }
    std::ostringstream s;
    s << "[" << at[0] << "," << at[1] << "," << at[2] << "," << at[3] << "]";
    return s.str();
}

std::size_t numel(const std::array<std::int64_t, 4>& shape) {
    std::size_t n = 1;
    for (std::int64_t s : shape) n *= static_cast<std::size_t>(s);
    return n;
}

KernelInfo validate(const std::string& path, const wire::Hello& h) {
    const std::string file = "kernel " + path;
    switch (h.status) {
        case wire::HelloStatus::Loaded: break;
        case wire::HelloStatus::NotLoadable: throw LoadError(file + " is not a loadable shared library: " + h.message);
        case wire::HelloStatus::NoEntryPoint:
            throw LoadError(file + " does not export " + ATTN_KERNEL_ENTRY_POINT + " (attn/kernel_abi.h): " + h.message);
        case wire::HelloStatus::NullDescription: throw LoadError(file + ": " + ATTN_KERNEL_ENTRY_POINT + " returned NULL");
    }
    if (h.abi_version != ATTN_KERNEL_ABI_VERSION)
        throw LoadError(file + " was built against attn kernel ABI version " + std::to_string(h.abi_version) +
                        "; this attn speaks version " + std::to_string(ATTN_KERNEL_ABI_VERSION) +
                        " (rebuild the kernel against this attn's attn/kernel_abi.h)");
    KernelInfo k;
    k.path = path;
    k.name = h.name;
    k.version = h.version;
    k.description = h.description;
    k.error_model = h.error_model_null ? "generic" : h.error_model;
    k.dtypes = h.dtypes;
    k.masks = h.masks;
    k.empty_rows = h.empty_rows;
    k.gqa = h.gqa != 0;
    k.strided = h.strided != 0;
    k.weights = h.weights != 0;
    k.max_dk = h.max_dk;
    k.max_dv = h.max_dv;
    k.key_block = h.key_block;
    k.exp_ulps = h.exp_ulps;
    std::vector<std::string> wrong;
    if (h.name_null || !valid_name(k.name)) wrong.push_back("its name must be letters, digits and '_' (got '" + k.name + "')");
    if (h.forward_null) wrong.push_back("forward is NULL");
    if (h.reserved_set) wrong.push_back("reserved must be NULL in ABI version 1");
    constexpr std::uint32_t sent_dtypes = ATTN_KERNEL_FLOAT32 | ATTN_KERNEL_FLOAT64;
    if (k.dtypes & ~(sent_dtypes | ATTN_KERNEL_FLOAT16 | ATTN_KERNEL_BFLOAT16)) wrong.push_back("dtypes has unknown bits");
    if (!(k.dtypes & sent_dtypes)) wrong.push_back("dtypes names neither float32 nor float64");
    if (k.masks & ~std::uint32_t(ATTN_KERNEL_MASK_BOOL | ATTN_KERNEL_CAUSAL_TOP_LEFT | ATTN_KERNEL_CAUSAL_BOTTOM_RIGHT))
        wrong.push_back("masks has unknown bits");
    if (k.empty_rows & ~std::uint32_t(ATTN_KERNEL_EMPTY_ZERO | ATTN_KERNEL_EMPTY_NAN)) wrong.push_back("empty_rows has unknown bits");
    if (k.max_dk < 0 || k.max_dv < 0) wrong.push_back("max_dk and max_dv must be >= 0");
    if (k.error_model != "generic" && k.error_model != "reference" && k.error_model != "tiled")
        wrong.push_back("error_model must be generic, reference or tiled (got '" + k.error_model + "')");
    if (k.error_model == "tiled" && k.key_block <= 0) wrong.push_back("error_model tiled needs key_block > 0");
    if (!std::isfinite(k.exp_ulps) || k.exp_ulps < 0) wrong.push_back("exp_ulps must be finite and >= 0");
    if (!wrong.empty()) {
        std::string text = file + ": its description breaks attn/kernel_abi.h:";
        for (const std::string& w : wrong) text += " " + w + ";";
        text.pop_back();
        throw LoadError(text);
    }
    return k;
}

}  // namespace

std::string KernelInfo::capabilities() const {
    std::ostringstream s;
    s << ((dtypes & ATTN_KERNEL_FLOAT32) && (dtypes & ATTN_KERNEL_FLOAT64) ? "float32 float64"
          : (dtypes & ATTN_KERNEL_FLOAT32)                                  ? "float32"
                                                                            : "float64");
    s << "; masks:";
    if (!masks) s << " none";
    if (masks & ATTN_KERNEL_MASK_BOOL) s << " bool";
    if (masks & ATTN_KERNEL_CAUSAL_TOP_LEFT) s << " causal-top-left";
    if (masks & ATTN_KERNEL_CAUSAL_BOTTOM_RIGHT) s << " causal-bottom-right";
    s << "; empty rows:";
    if (!empty_rows) s << " none";
    if (empty_rows & ATTN_KERNEL_EMPTY_ZERO) s << " zero";
    if (empty_rows & ATTN_KERNEL_EMPTY_NAN) s << " nan";
    s << "; gqa " << (gqa ? "yes" : "no") << "; strided " << (strided ? "yes" : "no") << "; weights "
      << (weights ? "yes" : "no");
    if (max_dk) s << "; Dk <= " << max_dk;
    if (max_dv) s << "; Dv <= " << max_dv;
    s << "; error model " << error_model;
    if (error_model == "tiled") s << "(" << key_block << ")";
    if (exp_ulps > 0) s << ", exp within " << exp_ulps << " ulps";
    return s.str();
}

std::string default_worker_path() {
    if (const char* env = std::getenv("ATTN_KERNEL_WORKER"); env && *env) return env;
    return ATTN_KERNEL_WORKER_DEFAULT;
}

KernelProcess::KernelProcess(const std::string& path, double timeout_seconds, std::string worker)
    : path_(path), worker_(worker.empty() ? default_worker_path() : std::move(worker)), timeout_(timeout_seconds) {
    struct stat st{};
    if (stat(path_.c_str(), &st) != 0) throw LoadError("kernel " + path_ + ": " + errno_text());
    if (!S_ISREG(st.st_mode)) throw LoadError("kernel " + path_ + " is not a file");
    if (access(worker_.c_str(), X_OK) != 0)
        throw LoadError("kernel " + path_ + ": the worker program " + worker_ + " cannot be run: " + errno_text() +
                        " (set ATTN_KERNEL_WORKER)");
    memfd_ = memfd_create("attn-kernel-call", MFD_CLOEXEC);
    if (memfd_ < 0) throw LoadError("kernel " + path_ + ": memfd_create: " + errno_text());
    start();
}

KernelProcess::KernelProcess(Connection connection, double timeout_seconds)
    : path_("<connected worker>"), timeout_(timeout_seconds), socket_(connection.socket), memfd_(connection.memfd),
      connected_(true) {
    read_hello();
}

KernelProcess::~KernelProcess() {
    stop();
    if (region_) munmap(region_, region_bytes_);
    if (memfd_ >= 0) close(memfd_);
}

void KernelProcess::start() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        throw KernelFailure("kernel " + info_.name + ": socketpair: " + errno_text());
    // The worker's descriptors, above every one of ours so that dup2 never meets itself (and keeps CLOEXEC).
    const int child_socket = std::max(sv[1], memfd_) + 1, child_memfd = child_socket + 1;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], child_socket);
    posix_spawn_file_actions_adddup2(&actions, memfd_, child_memfd);
    const std::string socket_arg = std::to_string(child_socket), memfd_arg = std::to_string(child_memfd);
    std::vector<char*> argv = {const_cast<char*>(worker_.c_str()), const_cast<char*>(socket_arg.c_str()),
                               const_cast<char*>(memfd_arg.c_str()), const_cast<char*>(path_.c_str()), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, worker_.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        throw LoadError("kernel " + path_ + ": cannot start " + worker_ + ": " + std::strerror(rc));
    }
    pid_ = pid;
    socket_ = sv[0];
    read_hello();
}

int KernelProcess::wait_ms() const { return timeout_ > 0 ? static_cast<int>(timeout_ * 1000) : -1; }

void KernelProcess::read_hello() {
    wire::Hello hello;
    pollfd pfd{socket_, POLLIN, 0};
    const int ready = poll(&pfd, 1, wait_ms());
    const ssize_t n = ready > 0 ? recv(socket_, &hello, sizeof hello, 0) : -1;
    if (ready == 0) {
        stop();
        throw LoadError("kernel " + path_ + " did not finish loading within " + std::to_string(timeout_) + " s");
    }
    if (n != static_cast<ssize_t>(sizeof hello) || hello.magic != wire::kMagic) {
        const std::string how = died("while loading");
        throw LoadError("kernel " + path_ + ": the worker " + how);
    }
    try {
        KernelInfo info = validate(path_, hello);
        if (started_once_ && info.name != info_.name)
            throw LoadError("kernel " + path_ + " changed its name from " + info_.name + " to " + info.name);
        info_ = std::move(info);
    } catch (...) {
        stop();
        throw;
    }
    started_once_ = true;
}

void KernelProcess::stop() {
    if (socket_ >= 0) close(socket_);  // the worker exits on end of file
    socket_ = -1;
    if (pid_ > 0) {
        int status = 0;
        for (int i = 0; i < 50 && waitpid(pid_, &status, WNOHANG) == 0; ++i) usleep(2000);
        if (waitpid(pid_, &status, WNOHANG) == 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, &status, 0);
        }
    }
    pid_ = -1;
}

std::string KernelProcess::died(const std::string& when) {
    if (socket_ >= 0) close(socket_);
    socket_ = -1;
    int status = 0;
    std::string how = "stopped answering " + when;
    if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_) {
        if (WIFSIGNALED(status)) how = "crashed " + when + " with " + signal_text(WTERMSIG(status));
        else if (WIFEXITED(status)) how = "exited " + when + " with status " + std::to_string(WEXITSTATUS(status));
    }
    pid_ = -1;
    return how;
}

void KernelProcess::ensure_region(std::size_t bytes) {
    if (bytes <= region_bytes_) return;
    const std::size_t size = std::max(bytes, 2 * region_bytes_);
    if (ftruncate(memfd_, static_cast<off_t>(size)) != 0)
        throw KernelFailure("kernel " + info_.name + ": cannot size the shared region to " + std::to_string(size) +
                            " bytes: " + errno_text());
    if (region_) munmap(region_, region_bytes_);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_, 0);
    if (p == MAP_FAILED) {
        region_ = nullptr;
        region_bytes_ = 0;
        throw KernelFailure("kernel " + info_.name + ": cannot map the shared region: " + errno_text());
    }
    region_ = static_cast<char*>(p);
    region_bytes_ = size;
}

void KernelProcess::forward(const ForwardCall& call, void* out, void* weights) {
    if (connected_ && socket_ < 0) throw KernelFailure("kernel " + info_.name + ": its process has gone (see above)");
    if (pid_ < 0 && !connected_) {
        start();  // after a failure: a fresh worker
        ++restarts_;
    }
    const std::string who = "kernel " + info_.name;
    const std::size_t elem = static_cast<std::size_t>(call.bits / 8);
    const std::array<std::int64_t, 4> weights_shape = {call.out_shape[0], call.out_shape[1], call.out_shape[2], call.k.shape[2]};
    const std::size_t out_bytes = numel(call.out_shape) * elem;
    const std::size_t weights_bytes = call.want_weights ? numel(weights_shape) * elem : 0;
    // Layout: q, k, v, mask, then guard | out | guard and guard | weights | guard.
    std::size_t at = 0;
    const auto place = [&](std::size_t bytes) {
        const std::size_t offset = at;
        at = align_up(at + bytes);
        return offset;
    };
    const std::size_t q_at = place(call.q.bytes), k_at = place(call.k.bytes), v_at = place(call.v.bytes);
    const std::size_t mask_at = call.mask ? place(call.mask->bytes) : 0;
    const std::size_t out_at = place(kGuardBytes + out_bytes + kGuardBytes) + kGuardBytes;
    const std::size_t weights_at = call.want_weights ? place(kGuardBytes + weights_bytes + kGuardBytes) + kGuardBytes : 0;
    ensure_region(std::max<std::size_t>(at, 64));

    wire::Request request;
    request.region_bytes = region_bytes_;
    request.code = 2;  // kDLFloat
    request.bits = static_cast<std::uint8_t>(call.bits);
    const auto ref = [&](std::size_t offset, const std::array<std::int64_t, 4>& shape, const std::array<std::int64_t, 4>& strides) {
        wire::TensorRef r;
        r.offset = static_cast<std::int64_t>(offset);
        std::copy(shape.begin(), shape.end(), r.shape);
        std::copy(strides.begin(), strides.end(), r.strides);
        return r;
    };
    const auto dense = [](const std::array<std::int64_t, 4>& s) {
        return std::array<std::int64_t, 4>{s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
    };
    // (An empty tensor may come with a null pointer: memcpy and memcmp never see it.)
    const auto send_input = [&](const InputTensor& t, std::size_t offset) {
        if (t.bytes) std::memcpy(region_ + offset, t.data, t.bytes);
        return ref(offset, t.shape, t.strides);
    };
    request.q = send_input(call.q, q_at);
    request.k = send_input(call.k, k_at);
    request.v = send_input(call.v, v_at);
    if (call.mask) request.mask = send_input(*call.mask, mask_at);
    const auto prepare_output = [&](std::size_t offset, std::size_t bytes) {
        std::memset(region_ + offset - kGuardBytes, kGuardByte, kGuardBytes);
        std::memset(region_ + offset + bytes, kGuardByte, kGuardBytes);
        for (std::size_t i = 0; i < bytes / elem; ++i) {
            if (elem == 4) std::memcpy(region_ + offset + i * 4, &kUnwrittenFloat, 4);
            else std::memcpy(region_ + offset + i * 8, &kUnwrittenDouble, 8);
        }
    };
    prepare_output(out_at, out_bytes);
    request.out = ref(out_at, call.out_shape, dense(call.out_shape));
    if (call.want_weights) {
        prepare_output(weights_at, weights_bytes);
        request.weights = ref(weights_at, weights_shape, dense(weights_shape));
    }
    request.scale = call.scale;
    request.causal = call.causal;
    request.empty_rows = call.empty_rows;
    request.num_threads = call.num_threads;

    if (send(socket_, &request, sizeof request, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof request))
        throw KernelFailure(who + ": its worker " + died("before the call"));
    wire::Reply reply;
    pollfd pfd{socket_, POLLIN, 0};
    int ready;
    do ready = poll(&pfd, 1, wait_ms());
    while (ready < 0 && errno == EINTR);
    if (ready == 0) {
        if (pid_ > 0) kill(pid_, SIGKILL);
        died("");
        std::ostringstream s;
        s << who << " did not return within " << timeout_ << " s (hung; stopped)";
        // A kernel that hung once gets 1 s from now on: shrinking the case retries it many times, and the suite's
        // cases take milliseconds.
        timeout_ = std::min(timeout_, 1.0);
        throw KernelFailure(s.str());
    }
    const ssize_t n = recv(socket_, &reply, sizeof reply, 0);
    if (n != static_cast<ssize_t>(sizeof reply) || reply.magic != wire::kMagic) throw KernelFailure(who + " " + died("during the call"));

    // What the kernel did to memory it does not own.
    std::vector<std::string> wrong;
    const auto guards_intact = [&](std::size_t offset, std::size_t bytes, const char* name) {
        const auto intact = [&](const char* p) {
            return std::all_of(p, p + kGuardBytes, [](char c) { return static_cast<unsigned char>(c) == kGuardByte; });
        };
        if (!intact(region_ + offset - kGuardBytes)) wrong.push_back(std::string("wrote before the start of ") + name);
        if (!intact(region_ + offset + bytes)) wrong.push_back(std::string("wrote past the end of ") + name);
    };
    guards_intact(out_at, out_bytes, "out");
    if (call.want_weights) guards_intact(weights_at, weights_bytes, "weights");
    const auto unchanged = [&](const InputTensor& t, std::size_t offset, const char* name) {
        if (t.bytes && std::memcmp(region_ + offset, t.data, t.bytes) != 0) wrong.push_back(std::string("wrote into its input ") + name);
    };
    unchanged(call.q, q_at, "q");
    unchanged(call.k, k_at, "k");
    unchanged(call.v, v_at, "v");
    if (call.mask) unchanged(*call.mask, mask_at, "allowed_mask");
    if (reply.status == ATTN_KERNEL_OK) {
        const auto all_written = [&](std::size_t offset, std::size_t bytes, const std::array<std::int64_t, 4>& shape,
                                     const char* name) {
            std::size_t first = bytes, count = 0;
            for (std::size_t i = 0; i < bytes / elem; ++i) {
                const bool untouched = elem == 4 ? std::memcmp(region_ + offset + i * 4, &kUnwrittenFloat, 4) == 0
                                                 : std::memcmp(region_ + offset + i * 8, &kUnwrittenDouble, 8) == 0;
                if (untouched && count++ == 0) first = i;
            }
            if (count)
                wrong.push_back(std::string("left ") + name + dense_index(first, shape) +
                                (count > 1 ? " and " + std::to_string(count - 1) + " more elements" : std::string()) +
                                " unwritten");
        };
        all_written(out_at, out_bytes, call.out_shape, "out");
        if (call.want_weights) all_written(weights_at, weights_bytes, weights_shape, "weights");
    }
    if (!wrong.empty()) {
        std::string text = who;
        for (std::size_t i = 0; i < wrong.size(); ++i) text += (i ? ", " : " ") + wrong[i];
        throw KernelFailure(text);
    }
    if (reply.status == ATTN_KERNEL_UNSUPPORTED) throw KernelDeclined(reply.message);
    if (reply.status != ATTN_KERNEL_OK)
        throw KernelFailure(who + " returned " + (reply.status == ATTN_KERNEL_FAILED ? "ATTN_KERNEL_FAILED" : "status " + std::to_string(reply.status)) +
                            ": " + reply.message);
    if (out_bytes) std::memcpy(out, region_ + out_at, out_bytes);
    if (call.want_weights && weights && weights_bytes) std::memcpy(weights, region_ + weights_at, weights_bytes);
}

}  // namespace attn::plugin
