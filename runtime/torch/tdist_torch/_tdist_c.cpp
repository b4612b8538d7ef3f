// _tdist_c: the C++ half of the PyTorch backend "tdist" (see __init__.py and build_ext.py).
//
// A c10d ProcessGroup (PyTorch 1.x) or c10d::Backend (2.x) whose hot collectives (all_reduce and
// broadcast of one contiguous CPU tensor: dist.all_reduce, DDP's buckets and broadcast_coalesced)
// call libtdist from C++, without the Python interpreter; every other call goes to the Python
// group (tdist_torch.ProcessGroupTdist) that owns the same libtdist group. Built against the
// installed PyTorch's headers (one build per PyTorch version), it links neither libtdist nor
// anything but PyTorch: the Python side hands it the addresses of the libtdist functions it has
// loaded, so both halves use one library and one group.
//
// Sequence numbers (getSequenceNumberForGroup, what PyTorch's _ProcessGroupWrapper puts in each
// collective's fingerprint under TORCH_DISTRIBUTED_DEBUG=DETAIL) follow gloo's: they start at 0
// (setSequenceNumberForGroup agrees on that without messages) and every call on the group, send
// and recv included, adds one on the rank that makes it.
//
// Threads: libtdist takes one thread at a time per group; Core::mu is that lock, held by this
// file around each submission and by the Python group (`with core:`) around its own calls.
// Async works (messages of at least Core::async_min bytes) run on libtdist's worker thread; a
// work is waited for by wait() on the caller's thread, or by the core's completion thread once
// its future is asked for (DDP's communication hooks). Core::close() (the Python group's
// shutdown) ends every unfinished work before libtdist's group is finalized.

#include <tdist/tdist.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace {

#if TORCH_VERSION_MAJOR >= 2
using Base = c10d::Backend;
#else
using Base = c10d::ProcessGroup;
#endif
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// The libtdist functions this file calls, by address from Python (in this order).
struct Api {
  decltype(&tdist_all_reduce) all_reduce;
  decltype(&tdist_all_reduce_async) all_reduce_async;
  decltype(&tdist_broadcast) broadcast;
  decltype(&tdist_broadcast_async) broadcast_async;
  decltype(&tdist_work_wait) work_wait;
  decltype(&tdist_work_test) work_test;
  decltype(&tdist_work_destroy) work_destroy;
  decltype(&tdist_pg_last_error) pg_last_error;
  decltype(&tdist_strerror) strerror;
};

// torch dtype -> libtdist dtype, or -1.
int dtype_code(c10::ScalarType t) {
  switch (t) {
    case c10::kHalf: return TDIST_FLOAT16;
    case c10::kBFloat16: return TDIST_BFLOAT16;
    case c10::kFloat: return TDIST_FLOAT32;
    case c10::kDouble: return TDIST_FLOAT64;
    case c10::kChar: return TDIST_INT8;
    case c10::kByte: return TDIST_UINT8;
    case c10::kInt: return TDIST_INT32;
    case c10::kLong: return TDIST_INT64;
    default: return -1;
  }
}

// c10d ReduceOp -> libtdist op, or -1 (PREMUL_SUM and anything newer: the Python group says why).
int op_code(const c10d::ReduceOp &op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return TDIST_SUM;
    case c10d::ReduceOp::PRODUCT: return TDIST_PROD;
    case c10d::ReduceOp::MIN: return TDIST_MIN;
    case c10d::ReduceOp::MAX: return TDIST_MAX;
    case c10d::ReduceOp::AVG: return TDIST_AVG;
    case c10d::ReduceOp::BAND: return TDIST_BAND;
    case c10d::ReduceOp::BOR: return TDIST_BOR;
    case c10d::ReduceOp::BXOR: return TDIST_BXOR;
    default: return -1;
  }
}

// A contiguous dense CPU tensor: the only kind the C++ paths take.
bool plain_cpu(const at::Tensor &t) {
  return t.defined() && t.device().is_cpu() && t.layout() == c10::kStrided && t.is_contiguous();
}

std::exception_ptr make_error(const std::string &msg) {
  try {
#if TORCH_VERSION_MAJOR >= 2
    C10_THROW_ERROR(DistBackendError, msg);  // torch.distributed.DistBackendError in Python
#else
    TORCH_CHECK(false, msg);  // RuntimeError
#endif
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

c10::intrusive_ptr<c10::ivalue::Future> done_future(const std::vector<at::Tensor> &result) {
  auto f = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  f->markCompleted(c10::IValue(result));
  return f;
}

}  // namespace

// Works and the completion thread. ------------------------------------------------------------
namespace {

// An async libtdist work and what it holds until it ends.
struct AsyncState {
  std::mutex mu;
  tdist_work_t *handle = nullptr;  // libtdist's work; null once ended
  bool ended = false;
  std::string what;
  std::exception_ptr error;
  std::vector<at::Tensor> result;  // the tensors libtdist reads and writes (and the future's value)
  c10::intrusive_ptr<c10::ivalue::Future> future;
};

// The thread that ends the works whose future was asked for (DDP's communication hooks wait on
// futures in C++), started at the first such work. `end` waits for a work and settles its future.
class Completion {
 public:
  explicit Completion(std::function<void(const std::shared_ptr<AsyncState> &)> end) : end_(std::move(end)) {}

  // Hands the work to the thread (started here on first use). The caller holds s->mu.
  void push(const std::shared_ptr<AsyncState> &s) {
    std::lock_guard<std::mutex> q(queue_mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(s);
    queue_cv_.notify_one();
  }

  // Ends the thread once the works handed to it have ended. Idempotent.
  void stop() {
    std::thread t;
    {
      std::lock_guard<std::mutex> q(queue_mu_);
      stop_ = true;
      queue_cv_.notify_all();
      t = std::move(thread_);
    }
    if (t.joinable()) {
      if (t.get_id() == std::this_thread::get_id())
        t.detach();  // the last holder let go in a future's callback: the loop ends by itself
      else
        t.join();
    }
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<AsyncState> s;
      {
        std::unique_lock<std::mutex> q(queue_mu_);
        queue_cv_.wait(q, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        s = queue_.front();
        queue_.pop_front();
      }
      end_(s);
    }
  }

  std::function<void(const std::shared_ptr<AsyncState> &)> end_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<AsyncState>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

// The core: libtdist's group shared by both halves. ---------------------------------------------
namespace {

// What the C++ group and the Python group share: libtdist's group, its lock and the works.
class Core {
 public:
  Core(uintptr_t pg, const Api &api, int64_t async_min, int64_t timeout_ms)
      : pg_(reinterpret_cast<tdist_pg_t *>(pg)), api_(api), async_min_(async_min), timeout_ms_(timeout_ms) {}
  ~Core() { close(); }

  std::mutex mu;  // libtdist: one thread at a time per group

  tdist_pg_t *pg() const { return pg_; }
  const Api &api() const { return api_; }
  int64_t async_min() const { return async_min_; }
  bool closed() const { return closed_; }

  // = the Python group's _make_error: a timeout says gloo's words first.
  std::string error_text(const char *what, tdist_status_t st) {
    const char *d = api_.pg_last_error(pg_);
    std::string detail = d && *d ? d : api_.strerror(st);
    std::string head = std::string("tdist ") + what + " failed: ";
    if (st == TDIST_ERR_TIMEOUT)
      head += "Timed out waiting " + std::to_string(timeout_ms_) + "ms for " + what + " to complete: ";
    return head + detail;
  }

  void track(const std::shared_ptr<AsyncState> &s) {
    std::vector<std::shared_ptr<AsyncState>> check;
    {
      std::lock_guard<std::mutex> g(works_mu_);
      works_.insert(s);
      if (works_.size() >= 1024) check.assign(works_.begin(), works_.end());
    }
    // Works nobody waits for (async ops fired and forgotten) would hold their tensors for
    // ever: end the finished ones.
    for (auto &w : check) test(w);
  }

  // Waits for the work once (later calls return at once), then stops tracking it.
  void end(const std::shared_ptr<AsyncState> &s) {
    c10::intrusive_ptr<c10::ivalue::Future> fut;
    {
      std::lock_guard<std::mutex> g(s->mu);
      if (!s->ended) {
        tdist_status_t st = api_.work_wait(s->handle, -1);
        api_.work_destroy(s->handle);
        s->handle = nullptr;
        if (st != TDIST_OK) s->error = make_error(error_text(s->what.c_str(), st));
        s->ended = true;
        fut = s->future;
      }
    }
    if (fut) settle(s, fut);
    std::lock_guard<std::mutex> g(works_mu_);
    works_.erase(s);
  }

  // Work.wait(timeout)'s bound (= the Python group's _AsyncWork._wait_for): returns once the
  // work has finished (end() then reports how); past ms it throws and the work goes on.
  void wait_for(const std::shared_ptr<AsyncState> &s, int64_t ms) {
    {
      std::lock_guard<std::mutex> g(s->mu);
      if (s->ended || api_.work_wait(s->handle, ms) == TDIST_OK) return;
      int done = 0;
      api_.work_test(s->handle, &done);
      if (done) return;
    }
    std::string ws = s->what, n = std::to_string(ms);
    std::rethrow_exception(make_error("tdist " + ws + ": Timed out waiting " + n + "ms for " + ws +
                                      " to complete (the timeout given to wait(); the " + ws +
                                      " goes on, and wait() again waits for it)"));
  }

  // Whether the work has ended, ending it when libtdist says it is done.
  bool test(const std::shared_ptr<AsyncState> &s) {
    {
      std::unique_lock<std::mutex> g(s->mu, std::try_to_lock);
      if (!g.owns_lock()) return false;  // being waited for elsewhere
      if (s->ended) return true;
      int done = 0;
      api_.work_test(s->handle, &done);
      if (!done) return false;
    }
    end(s);
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> future(const std::shared_ptr<AsyncState> &s) {
    std::lock_guard<std::mutex> g(s->mu);
    if (!s->future) {
      s->future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      if (s->ended)
        settle(s, s->future);
      else
        completion_.push(s);
    }
    return s->future;
  }

  // Ends every unfinished work and the completion thread; later calls are refused. Idempotent.
  void close() {
    {
      // Later calls are refused; one running on the calling thread ends first.
      std::lock_guard<std::mutex> g(mu);
      closed_ = true;
    }
    std::vector<std::shared_ptr<AsyncState>> left;
    {
      std::lock_guard<std::mutex> g(works_mu_);
      left.assign(works_.begin(), works_.end());
    }
    for (auto &s : left) end(s);
    completion_.stop();
  }

 private:
  static void settle(const std::shared_ptr<AsyncState> &s, const c10::intrusive_ptr<c10::ivalue::Future> &f) {
    if (f->completed()) return;
    if (s->error)
      f->setError(s->error);
    else
      f->markCompleted(c10::IValue(s->result));
  }

  tdist_pg_t *pg_;
  Api api_;
  int64_t async_min_;
  int64_t timeout_ms_;  // the group's: every call's deadline
  std::atomic<bool> closed_{false};
  std::mutex works_mu_;
  std::unordered_set<std::shared_ptr<AsyncState>> works_;
  Completion completion_{[this](const std::shared_ptr<AsyncState> &s) { end(s); }};
};

}  // namespace

// The works a group returns. ---------------------------------------------------------------------
namespace {

// The work of a collective that ran on the calling thread and has finished.
class DoneWork : public c10d::Work {
 public:
  DoneWork(int rank, c10d::OpType type, std::vector<at::Tensor> result)
      : Work(rank, type), result_(std::move(result)) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return done_future(result_); }

 private:
  std::vector<at::Tensor> result_;
};

// The work of a collective on libtdist's worker thread.
class AsyncWork : public c10d::Work {
 public:
  AsyncWork(int rank, c10d::OpType type, std::shared_ptr<Core> core, std::shared_ptr<AsyncState> s)
      : Work(rank, type), core_(std::move(core)), s_(std::move(s)) {}
  bool isCompleted() override { return core_->test(s_); }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(s_->mu);
    return s_->ended && !s_->error;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> g(s_->mu);
    return s_->error;
  }
  // A timeout (0: none, PyTorch's kNoTimeout) bounds this wait as gloo's does; the group's
  // timeout bounds the collective.
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout.count() > 0) core_->wait_for(s_, timeout.count());
    core_->end(s_);
    if (s_->error) std::rethrow_exception(s_->error);
    return true;
  }
  std::vector<at::Tensor> result() override { return s_->result; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return core_->future(s_); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<AsyncState> s_;
};

}  // namespace

// The calls handed to the Python group. -------------------------------------------------------
namespace {

// A c10d group that hands every call to the Python group (its delegate), counting each in the
// sequence number. Group overrides the calls it runs in C++.
class PythonCalls : public Base {
 public:
  PythonCalls(int rank, int size, py::object delegate) : Base(rank, size), delegate_(std::move(delegate)) {}

  ~PythonCalls() override { release_delegate(); }

  const std::string getBackendName() const override { return "tdist"; }
  py::object delegate() const { return delegate_; }

  // gloo's semantics: every rank starts at 0, so agreeing needs no messages.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(std::memory_order_relaxed); }

  WorkPtr allreduce(std::vector<at::Tensor> &ts, const c10d::AllreduceOptions &o = {}) override {
    return call("allreduce", ts, o);
  }
  WorkPtr broadcast(std::vector<at::Tensor> &ts, const c10d::BroadcastOptions &o = {}) override {
    return call("broadcast", ts, o);
  }
  WorkPtr allreduce_coalesced(std::vector<at::Tensor> &ts, const c10d::AllreduceCoalescedOptions &o = {}) override {
    return call("allreduce_coalesced", ts, o);
  }
  WorkPtr reduce(std::vector<at::Tensor> &ts, const c10d::ReduceOptions &o = {}) override {
    return call("reduce", ts, o);
  }
  WorkPtr allgather(std::vector<std::vector<at::Tensor>> &out, std::vector<at::Tensor> &in,
                    const c10d::AllgatherOptions &o = {}) override {
    return call("allgather", out, in, o);
  }
  WorkPtr _allgather_base(at::Tensor &out, at::Tensor &in, const c10d::AllgatherOptions &o = {}) override {
    return call("_allgather_base", out, in, o);
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>> &out, std::vector<at::Tensor> &in,
                              const c10d::AllgatherOptions &o = {}) override {
    return call("allgather_coalesced", out, in, o);
  }
  WorkPtr gather(std::vector<std::vector<at::Tensor>> &out, std::vector<at::Tensor> &in,
                 const c10d::GatherOptions &o = {}) override {
    return call("gather", out, in, o);
  }
  WorkPtr scatter(std::vector<at::Tensor> &out, std::vector<std::vector<at::Tensor>> &in,
                  const c10d::ScatterOptions &o = {}) override {
    return call("scatter", out, in, o);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor> &out, std::vector<std::vector<at::Tensor>> &in,
                         const c10d::ReduceScatterOptions &o = {}) override {
    return call("reduce_scatter", out, in, o);
  }
  WorkPtr _reduce_scatter_base(at::Tensor &out, at::Tensor &in, const c10d::ReduceScatterOptions &o = {}) override {
    return call("_reduce_scatter_base", out, in, o);
  }
  WorkPtr alltoall_base(at::Tensor &out, at::Tensor &in, std::vector<int64_t> &out_splits,
                        std::vector<int64_t> &in_splits, const c10d::AllToAllOptions &o = {}) override {
    return call("alltoall_base", out, in, out_splits, in_splits, o);
  }
  WorkPtr alltoall(std::vector<at::Tensor> &out, std::vector<at::Tensor> &in,
                   const c10d::AllToAllOptions &o = {}) override {
    return call("alltoall", out, in, o);
  }
  WorkPtr send(std::vector<at::Tensor> &ts, int dst, int tag) override { return call("send", ts, dst, tag); }
  WorkPtr recv(std::vector<at::Tensor> &ts, int src, int tag) override { return call("recv", ts, src, tag); }
  WorkPtr recvAnysource(std::vector<at::Tensor> &ts, int tag) override { return call("recv_anysource", ts, tag); }
  WorkPtr barrier(const c10d::BarrierOptions &o = {}) override { return call("barrier", o); }
  void monitoredBarrier(const c10d::BarrierOptions &o = {}, bool wait_all_ranks = false) override {
    seq_.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire g;
    py::object timeout = py::none();
    if (o.timeout.count() >= 0) timeout = py::cast(o.timeout);
    delegate_.attr("monitored_barrier")(timeout, wait_all_ranks);
  }
#if TORCH_VERSION_MAJOR >= 2
  WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor> &out, std::vector<at::Tensor> &in,
                                          const c10d::AllgatherOptions &o = {}) override {
    return call("allgather_into_tensor_coalesced", out, in, o);
  }
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor> &out, std::vector<at::Tensor> &in,
                                          const c10d::ReduceScatterOptions &o = {}) override {
    return call("reduce_scatter_tensor_coalesced", out, in, o);
  }
#endif

 protected:
  // The Python group closes libtdist's group when it is collected; it may only be released
  // with the interpreter's lock held. Idempotent.
  void release_delegate() {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire g;
      delegate_ = py::object();
    } else {
      delegate_.release();
    }
  }

  template <typename... A>
  WorkPtr call(const char *name, A &...args) {
    seq_.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire g;
    py::object r = delegate_.attr(name)(args...);
    return r.cast<WorkPtr>();
  }

  py::object delegate_;
  std::atomic<uint64_t> seq_{0};  // calls made on this group (see the file's comment)
};

}  // namespace

// The groups PyTorch calls. ----------------------------------------------------------------------
namespace {

// The group PyTorch calls: all_reduce and broadcast of one contiguous CPU tensor run here, in
// C++; every other call, and those with other tensors, go to the Python group.
class Group : public PythonCalls {
 public:
  Group(int rank, int size, std::shared_ptr<Core> core, py::object delegate)
      : PythonCalls(rank, size, std::move(delegate)), core_(std::move(core)) {}
  // The Python group first, then the core (the order of the members before the split).
  ~Group() override { release_delegate(); }

  WorkPtr allreduce(std::vector<at::Tensor> &ts, const c10d::AllreduceOptions &o = {}) override {
    if (ts.size() == 1 && plain_cpu(ts[0])) {
      int d = dtype_code(ts[0].scalar_type());
      int op = op_code(o.reduceOp);
      if (d >= 0 && op >= 0 && (op < 5 || d >= 4)) {  // BAND, BOR, BXOR: integer dtypes only
        at::Tensor &t = ts[0];
        return run(c10d::OpType::ALLREDUCE, "all_reduce", ts, (size_t)t.numel() * t.element_size(),
                   [&] { return core_->api().all_reduce(core_->pg(), t.data_ptr(), t.numel(), (tdist_dtype_t)d, (tdist_reduce_op_t)op); },
                   [&](tdist_work_t **w) {
                     return core_->api().all_reduce_async(core_->pg(), t.data_ptr(), t.numel(), (tdist_dtype_t)d, (tdist_reduce_op_t)op, w);
                   });
      }
    }
    return call("allreduce", ts, o);
  }

  WorkPtr broadcast(std::vector<at::Tensor> &ts, const c10d::BroadcastOptions &o = {}) override {
    if (ts.size() == 1 && plain_cpu(ts[0]) && o.rootRank >= 0 && o.rootRank < getSize()) {
      at::Tensor &t = ts[0];
      size_t n = (size_t)t.numel() * t.element_size();
      int root = (int)o.rootRank;
      return run(c10d::OpType::BROADCAST, "broadcast", ts, n,
                 [&] { return core_->api().broadcast(core_->pg(), t.data_ptr(), n, TDIST_UINT8, root); },
                 [&](tdist_work_t **w) { return core_->api().broadcast_async(core_->pg(), t.data_ptr(), n, TDIST_UINT8, root, w); });
    }
    return call("broadcast", ts, o);
  }

 private:
  template <typename Blocking, typename Async>
  WorkPtr run(c10d::OpType type, const char *what, std::vector<at::Tensor> &ts, size_t nbytes, Blocking blocking,
              Async async) {
    seq_.fetch_add(1, std::memory_order_relaxed);
    if ((int64_t)nbytes < core_->async_min()) {
      tdist_status_t st;
      {
        std::lock_guard<std::mutex> g(core_->mu);
        TORCH_CHECK(!core_->closed(), "tdist ", what, ": the process group was shut down");
        st = blocking();
      }
      if (st != TDIST_OK) std::rethrow_exception(make_error(core_->error_text(what, st)));
      return c10::make_intrusive<DoneWork>(getRank(), type, ts);
    }
    auto s = std::make_shared<AsyncState>();
    s->what = what;
    s->result = ts;
    tdist_status_t st;
    {
      std::lock_guard<std::mutex> g(core_->mu);
      TORCH_CHECK(!core_->closed(), "tdist ", what, ": the process group was shut down");
      st = async(&s->handle);
    }
    if (st != TDIST_OK) std::rethrow_exception(make_error(core_->error_text(what, st)));
    core_->track(s);
    return c10::make_intrusive<AsyncWork>(getRank(), type, core_, s);
  }

  std::shared_ptr<Core> core_;
};

#if TORCH_VERSION_MAJOR >= 2
// The ProcessGroup of a group whose only backend is tdist (2.x). PyTorch's own ProcessGroup
// names a third-party backend "custom" (its BackendType has no other name), and that is what DDP's
// logging data and ProcessGroup.name() report; this one says "tdist". It holds no collectives:
// tdist_torch registers the Group (or PyTorch's _ProcessGroupWrapper around it) as its CPU
// backend, and PyTorch dispatches to that as for any ProcessGroup. Not used for a device map
// ("cpu:tdist,cuda:nccl"), where PyTorch's ProcessGroup must hold the other devices' backends.
class NamedGroup : public c10d::ProcessGroup {
 public:
  NamedGroup(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size)
      : c10d::ProcessGroup(store, rank, size) {}
  const std::string getBackendName() const override { return "tdist"; }
  // PyTorch's ProcessGroup answers these for gloo, nccl and ucc only; tdist's backend has them.
  void setSequenceNumberForGroup() override { getDefaultBackend()->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return getDefaultBackend()->getSequenceNumberForGroup(); }
};
#endif

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tdist_torch's C++ process group (built for one PyTorch version: TORCH_VERSION)";
  m.attr("TORCH_VERSION") = py::str(std::to_string(TORCH_VERSION_MAJOR) + "." +
                                     std::to_string(TORCH_VERSION_MINOR) + "." +
                                     std::to_string(TORCH_VERSION_PATCH));
  py::class_<Core, std::shared_ptr<Core>>(m, "Core")
      .def(py::init([](uintptr_t pg, std::vector<uintptr_t> fns, int64_t async_min, int64_t timeout_ms) {
             Api api;
             constexpr size_t n = sizeof(Api) / sizeof(void *);
             TORCH_CHECK(fns.size() == n, "_tdist_c.Core: expected ", n, " function addresses, got ", fns.size());
             for (size_t i = 0; i < n; i++) {
               TORCH_CHECK(fns[i] != 0, "_tdist_c.Core: function address ", i, " is null");
               std::memcpy(reinterpret_cast<char *>(&api) + i * sizeof(void *), &fns[i], sizeof(void *));
             }
             return std::make_shared<Core>(pg, api, async_min, timeout_ms);
           }),
           py::arg("pg"), py::arg("functions"), py::arg("async_min"), py::arg("timeout_ms"))
      // `with core:` holds libtdist's per-group lock (without the interpreter's lock while waiting).
      .def("__enter__",
           [](Core &c) {
             py::gil_scoped_release r;
             c.mu.lock();
           })
      .def("__exit__", [](Core &c, py::args) { c.mu.unlock(); })
      .def("close", &Core::close, py::call_guard<py::gil_scoped_release>(),
           "Ends every unfinished C++ work; later C++ calls are refused.");
  py::class_<Group, Base, c10::intrusive_ptr<Group>>(m, "Group")
      .def(py::init([](int rank, int size, std::shared_ptr<Core> core, py::object delegate) {
             return c10::make_intrusive<Group>(rank, size, std::move(core), std::move(delegate));
           }),
           py::arg("rank"), py::arg("size"), py::arg("core"), py::arg("delegate"))
      .def_property_readonly("delegate", &Group::delegate, "The Python group (tdist_torch.ProcessGroupTdist).");
#if TORCH_VERSION_MAJOR >= 2
  py::class_<NamedGroup, c10d::ProcessGroup, c10::intrusive_ptr<NamedGroup>>(m, "NamedGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size) {
             return c10::make_intrusive<NamedGroup>(store, rank, size);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"));
#endif
}
