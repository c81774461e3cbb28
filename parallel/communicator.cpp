// parallel/communicator.cpp: see communicator.h.
#include "parallel/communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <stdexcept>

#include "common/trace_span.h"
#include "parallel/nccl_backend.h"

namespace retort::parallel {
namespace {

std::atomic<int64_t> blocked_nanoseconds{0};

MPI_Datatype mpi_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return MPI_FLOAT;
    case torch::kDouble:
      return MPI_DOUBLE;
    case torch::kLong:
      return MPI_INT64_T;
    case torch::kInt:
      return MPI_INT32_T;
    case torch::kByte:
      return MPI_UINT8_T;
    case torch::kBFloat16:  // moved as bits; sums go through widened() first
    case torch::kHalf:
      return MPI_UINT16_T;
    default:
      throw std::invalid_argument("Communicator: unsupported dtype " +
                                  std::string(c10::toString(t.scalar_type())));
  }
}

// The sum of bfloat16 or half elements in their own type: each pair added in float32 and
// rounded to nearest even (c10's conversions), as a user-defined MPI operation on their bits.
template <typename Narrow>
void narrow_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const Narrow* a = static_cast<const Narrow*>(in);
  Narrow* b = static_cast<Narrow*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = Narrow(float(a[i]) + float(b[i]));
}

MPI_Op mpi_op(ReduceOp op, const torch::Tensor& t) {
  if (op == ReduceOp::Max) return MPI_MAX;
  if (op == ReduceOp::Sum) return MPI_SUM;
  // Created once, after MPI_Init (the first narrow sum), and kept for the process.
  static MPI_Op bf16 = MPI_OP_NULL, half = MPI_OP_NULL;
  if (t.scalar_type() == torch::kBFloat16) {
    if (bf16 == MPI_OP_NULL) MPI_Op_create(&narrow_sum<c10::BFloat16>, 1, &bf16);
    return bf16;
  }
  if (t.scalar_type() == torch::kHalf) {
    if (half == MPI_OP_NULL) MPI_Op_create(&narrow_sum<c10::Half>, 1, &half);
    return half;
  }
  return MPI_SUM;
}

void require_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.is_contiguous())
    throw std::invalid_argument(std::string("Communicator::") + what +
                                " needs a contiguous tensor");
}

// A reduction's buffer: 16-bit floats are summed in float32 and rounded once at the end (MPI
// has no bfloat16 type, and a sum rounded to 8 bits of mantissa at every step of a ring or
// tree would depend on the number of ranks); other tensors are reduced in place.
bool widened_for_sums(const torch::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
}
torch::Tensor sum_buffer(const torch::Tensor& t, ReduceOp op = ReduceOp::Sum) {
  return op != ReduceOp::SumNarrow && widened_for_sums(t) ? t.to(torch::kFloat) : t;
}
// What the finished reduction does: copy the float32 sum back, rounding once.
std::function<void()> round_back(const torch::Tensor& target, const torch::Tensor& buffer) {
  if (buffer.is_same(target)) return [target] {};
  return [target, buffer] { target.copy_(buffer); };
}

int64_t bytes_of(const torch::Tensor& t) {
  return t.numel() * t.element_size();
}

int64_t max_elements = std::numeric_limits<int>::max();

// Calls post(offset, count) for consecutive pieces of n elements, each within the limit; a
// message of no elements is still posted once, so sends and receives keep matching.
template <typename Post>
void for_each_piece(int64_t n, Post post) {
  if (n == 0) return post(int64_t(0), 0);
  for (int64_t offset = 0; offset < n; offset += max_elements)
    post(offset, int(std::min(max_elements, n - offset)));
}

// The address of element `offset` of a contiguous tensor.
void* element(const torch::Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * t.element_size();
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

// Whether a variable collective's counts and displacements all fit MPI's int.
bool fits(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return total <= max_elements;
}

}  // namespace

double exposed_communication_seconds() {
  return blocked_nanoseconds.load() * 1e-9;
}
void reset_exposed_communication_seconds() {
  blocked_nanoseconds = 0;
}
ExposedWait::ExposedWait() : start_(std::chrono::steady_clock::now()) {}
ExposedWait::~ExposedWait() {
  blocked_nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - start_)
                             .count();
}

Handle::Handle(MPI_Request request, std::function<void()> finish) : finish_(std::move(finish)) {
  if (request != MPI_REQUEST_NULL) requests_.push_back(request);
}
Handle::Handle(std::vector<MPI_Request> requests, std::function<void()> finish)
    : requests_(std::move(requests)), finish_(std::move(finish)) {}
Handle::Handle(std::function<bool()> ready, std::function<void()> finish)
    : ready_(std::move(ready)), finish_(std::move(finish)) {}
Handle::Handle(Handle&& other) noexcept {
  *this = std::move(other);
}
Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    if (pending()) wait();
    requests_ = std::move(other.requests_);
    ready_ = std::move(other.ready_);
    finish_ = std::move(other.finish_);
    label_ = other.label_;
    other.requests_.clear();
    other.ready_ = nullptr;
    other.finish_ = nullptr;
  }
  return *this;
}
Handle::~Handle() {
  if (pending()) wait();
}
void Handle::wait() {
  if (!requests_.empty()) {
    TraceSpan span([this] {
      return std::string("comm ") + label_.op + " [" +
             (label_.group_name ? *label_.group_name : std::string("?")) + "]";
    });
    ExposedWait blocked;
    wait_or_abort(requests_, label_);
  }
  requests_.clear();
  const bool device_work = static_cast<bool>(ready_);
  ready_ = nullptr;
  if (finish_) {
    auto finish = std::move(finish_);
    finish_ = nullptr;
    if (device_work) {  // the wait is in finish (NCCL work)
      ExposedWait blocked;
      finish();
    } else {
      finish();
    }
  }
}
Handle Handle::then(std::function<void()> after) && {
  std::function<void()> first = std::move(finish_);
  finish_ = [first, after] {
    if (first) first();
    after();
  };
  if (!pending()) {
    wait();
    return Handle();
  }
  return std::move(*this);
}

bool Handle::test() {
  if (ready_ && !ready_()) return false;
  if (!requests_.empty()) {
    int done = 0;
    MPI_Testall(int(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    if (!done) return false;
  }
  wait();
  return true;
}

namespace {
// An uninitialised host tensor of t's shape and type; pinned when t is on a GPU, so the
// copies in and out are DMA transfers.
torch::Tensor host_like(const torch::Tensor& t) {
  return torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(t.is_cuda()));
}
}  // namespace

Handle Communicator::staged(const torch::Tensor& in, torch::Tensor& out, bool copy_in,
                            bool copy_back,
                            const std::function<Handle(torch::Tensor&, torch::Tensor&)>& op) {
  torch::Tensor host_in = host_like(in);
  if (copy_in) host_in.copy_(in);  // a CUDA source: after the work queued on its stream
  torch::Tensor host_out = in.is_same(out) ? host_in : host_like(out);
  Handle handle;
  {
    staging_ = true;
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{staging_};
    handle = op(host_in, host_out);
  }
  if (!copy_back) return handle;
  torch::Tensor target = out;
  return std::move(handle).then([target, host_in, host_out]() mutable { target.copy_(host_out); });
}

int64_t Communicator::max_elements_per_call() {
  return max_elements;
}
void Communicator::set_max_elements_per_call(int64_t elements) {
  if (elements < 1 || elements > std::numeric_limits<int>::max())
    throw std::invalid_argument("max_elements_per_call must be in [1, INT_MAX]");
  max_elements = elements;
}

void Communicator::reduce_parts_to_owners(const torch::Tensor& in, torch::Tensor& out,
                                          const std::vector<int64_t>& counts,
                                          std::vector<MPI_Request>& requests, MPI_Op op) {
  const std::vector<int64_t> offsets = offsets_of(counts);
  for (int root = 0; root < size_; ++root)
    for_each_piece(counts[root], [&](int64_t offset, int n) {
      MPI_Request r;
      MPI_Ireduce(element(in, offsets[root] + offset),
                  rank_ == root ? element(out, offset) : nullptr, n, mpi_type(in), op, root, comm_,
                  &r);
      requests.push_back(r);
    });
}

void Communicator::broadcast_parts_from_owners(torch::Tensor& out,
                                               const std::vector<int64_t>& counts,
                                               std::vector<MPI_Request>& requests) {
  const std::vector<int64_t> offsets = offsets_of(counts);
  for (int root = 0; root < size_; ++root)
    for_each_piece(counts[root], [&](int64_t offset, int n) {
      MPI_Request r;
      MPI_Ibcast(element(out, offsets[root] + offset), n, mpi_type(out), root, comm_, &r);
      requests.push_back(r);
    });
}

Communicator::Communicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

std::unique_ptr<Communicator> Communicator::single(std::string name) {
  return std::unique_ptr<Communicator>(new Communicator(std::move(name)));
}

Communicator& Communicator::one_process() {
  static const std::unique_ptr<Communicator> group = single("one process");
  return *group;
}

Communicator::Communicator(std::string name) : comm_(MPI_COMM_NULL), name_(std::move(name)) {}

Communicator::~Communicator() {
  if (comm_ == MPI_COMM_NULL) return;  // a single-process group owns no MPI communicator
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
}

NcclBackend& Communicator::nccl(const torch::Tensor& t) {
  if (!nccl_) nccl_ = std::make_shared<NcclBackend>(comm_, int(t.device().index()), name_);
  if (nccl_->device() != t.device().index())
    throw std::invalid_argument("Communicator '" + name_ + "': a tensor on " + t.device().str() +
                                ", but the group's NCCL communicator is on GPU " +
                                std::to_string(nccl_->device()));
  return *nccl_;
}

namespace {
// A handle on NCCL work: test() polls it, wait() waits for it (collective_watchdog.h) and then
// runs `then` (a copy back from a widened buffer).
Handle nccl_handle(std::shared_ptr<NcclWork> work, std::function<void()> then = nullptr) {
  return Handle([work] { return work->ready(); },
                [work, then] {
                  work->wait();
                  if (then) then();
                });
}
}  // namespace

namespace {
// A group of one: the collective's result is its input (no MPI call).
bool copied_when_alone(int size, const torch::Tensor& in, torch::Tensor& out) {
  if (size != 1) return false;
  out.view({-1}).copy_(in.reshape({-1}));
  return true;
}
}  // namespace

void Communicator::count(const std::string& op, int64_t bytes) {
  OpCounter& c = counters_[op];
  c.calls += 1;
  c.bytes += bytes;
}

void Communicator::all_reduce(torch::Tensor& t, ReduceOp op) {
  all_reduce_async(t, op).wait();
}

Handle Communicator::all_reduce_async(torch::Tensor& t, ReduceOp op) {
  launch_queued_messages();
  require_contiguous(t, "all_reduce");
  if (size_ == 1) {
    count("all_reduce", bytes_of(t));
    return {};
  }
  if (stages())
    return staged(t, t, true, true,
                  [&](torch::Tensor&, torch::Tensor& host) { return all_reduce_async(host, op); });
  torch::Tensor buffer = sum_buffer(t, op);
  count("all_reduce", bytes_of(buffer));
  if (t.is_cuda())
    return nccl_handle(nccl(t).all_reduce(buffer, op == ReduceOp::Max ? NcclOp::Max : NcclOp::Sum),
                       round_back(t, buffer));
  std::vector<MPI_Request> requests;
  for_each_piece(buffer.numel(), [&](int64_t offset, int n) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, element(buffer, offset), n, mpi_type(buffer), mpi_op(op, buffer),
                   comm_, &r);
    requests.push_back(r);
  });
  return labelled(Handle(std::move(requests), round_back(t, buffer)), "all_reduce");
}

torch::Tensor Communicator::all_gather(const torch::Tensor& tensor, int64_t dim) {
  // Gather along dim 0 of a copy with `dim` moved to the front, then move it back.
  torch::Tensor front = tensor.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] *= size_;
  torch::Tensor gathered = torch::empty(shape, front.options());
  all_gather_flat_async(front, gathered).wait();
  return gathered.movedim(0, dim);
}

torch::Tensor Communicator::reduce_scatter(const torch::Tensor& tensor, int64_t dim, ReduceOp op) {
  torch::Tensor front = tensor.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  if (shape[0] % size_ != 0)
    throw std::invalid_argument("reduce_scatter: dim of size " + std::to_string(shape[0]) +
                                " does not split over " + std::to_string(size_) + " ranks");
  shape[0] /= size_;
  torch::Tensor out = torch::empty(shape, front.options());
  reduce_scatter_flat_async(front, out, op).wait();
  return out.movedim(0, dim);
}

Handle Communicator::all_gather_flat_async(const torch::Tensor& in, torch::Tensor& out) {
  launch_queued_messages();
  require_contiguous(in, "all_gather");
  require_contiguous(out, "all_gather");
  if (stages())
    return staged(in, out, true, true, [&](torch::Tensor& host_in, torch::Tensor& host_out) {
      return all_gather_flat_async(host_in, host_out);
    });
  count("all_gather", bytes_of(out));
  if (copied_when_alone(size_, in, out)) return {};
  if (in.is_cuda()) return nccl_handle(nccl(in).all_gather(in, out));
  std::vector<MPI_Request> requests;
  if (in.numel() > max_elements) {  // each rank broadcasts its part, in pieces
    out.view({-1}).narrow(0, rank_ * in.numel(), in.numel()).copy_(in.reshape({-1}));
    broadcast_parts_from_owners(out, std::vector<int64_t>(size_, in.numel()), requests);
    return labelled(Handle(std::move(requests), [in, out] {}), "all_gather");
  }
  MPI_Request request;
  MPI_Iallgather(in.data_ptr(), int(in.numel()), mpi_type(in), out.data_ptr(), int(in.numel()),
                 mpi_type(out), comm_, &request);
  return labelled(Handle(request, [in, out] {}), "all_gather");
}

Handle Communicator::reduce_scatter_flat_async(const torch::Tensor& in, torch::Tensor& out,
                                               ReduceOp op) {
  launch_queued_messages();
  require_contiguous(in, "reduce_scatter");
  require_contiguous(out, "reduce_scatter");
  if (op == ReduceOp::Max) throw std::invalid_argument("reduce_scatter: sums only");
  if (stages())
    return staged(in, out, true, true, [&](torch::Tensor& host_in, torch::Tensor& host_out) {
      return reduce_scatter_flat_async(host_in, host_out, op);
    });
  if (copied_when_alone(size_, in, out)) {
    count("reduce_scatter", bytes_of(in));
    return {};
  }
  const torch::Tensor wide_in = sum_buffer(in, op), wide_out = sum_buffer(out, op);
  count("reduce_scatter", bytes_of(wide_in));
  if (in.is_cuda())
    return nccl_handle(nccl(in).reduce_scatter(wide_in, wide_out), round_back(out, wide_out));
  if (out.numel() > max_elements) {  // each rank's part reduced onto it, in pieces
    std::vector<MPI_Request> requests;
    torch::Tensor target = wide_out;
    reduce_parts_to_owners(wide_in, target, std::vector<int64_t>(size_, out.numel()), requests,
                           mpi_op(op, wide_in));
    std::function<void()> finish = round_back(out, wide_out);
    return labelled(Handle(std::move(requests), [wide_in, finish] { finish(); }), "reduce_scatter");
  }
  MPI_Request request;
  MPI_Ireduce_scatter_block(wide_in.data_ptr(), wide_out.data_ptr(), int(out.numel()),
                            mpi_type(wide_in), mpi_op(op, wide_in), comm_, &request);
  std::function<void()> finish = round_back(out, wide_out);
  return labelled(Handle(request, [wide_in, finish] { finish(); }), "reduce_scatter");
}

Handle Communicator::reduce_scatter_v_async(const torch::Tensor& in, torch::Tensor& out,
                                            const std::vector<int64_t>& counts, ReduceOp op) {
  launch_queued_messages();
  if (stages())
    return staged(in, out, true, true, [&](torch::Tensor& host_in, torch::Tensor& host_out) {
      return reduce_scatter_v_async(host_in, host_out, counts, op);
    });
  require_contiguous(in, "reduce_scatter_v");
  require_contiguous(out, "reduce_scatter_v");
  if (copied_when_alone(size_, in, out)) {
    count("reduce_scatter", bytes_of(in));
    return {};
  }
  const torch::Tensor wide_in = sum_buffer(in, op);
  torch::Tensor wide_out = sum_buffer(out, op);
  count("reduce_scatter", bytes_of(wide_in));
  std::function<void()> finish = round_back(out, wide_out);
  if (in.is_cuda())
    return nccl_handle(nccl(in).reduce_scatter_v(wide_in, wide_out, counts), finish);
  if (!fits(counts)) {
    std::vector<MPI_Request> requests;
    reduce_parts_to_owners(wide_in, wide_out, counts, requests, mpi_op(op, wide_in));
    return labelled(Handle(std::move(requests), [wide_in, finish] { finish(); }),
                    "reduce_scatter_v");
  }
  // The count array must live until the operation completes.
  auto int_counts = std::make_shared<std::vector<int>>(counts.begin(), counts.end());
  MPI_Request request;
  MPI_Ireduce_scatter(wide_in.data_ptr(), wide_out.data_ptr(), int_counts->data(),
                      mpi_type(wide_in), mpi_op(op, wide_in), comm_, &request);
  return labelled(Handle(request, [int_counts, wide_in, finish] { finish(); }), "reduce_scatter_v");
}

Handle Communicator::all_gather_v_async(const torch::Tensor& in, torch::Tensor& out,
                                        const std::vector<int64_t>& counts) {
  launch_queued_messages();
  if (stages())
    return staged(in, out, true, true, [&](torch::Tensor& host_in, torch::Tensor& host_out) {
      return all_gather_v_async(host_in, host_out, counts);
    });
  require_contiguous(in, "all_gather_v");
  require_contiguous(out, "all_gather_v");
  count("all_gather", bytes_of(out));
  if (copied_when_alone(size_, in, out)) return {};
  if (in.is_cuda()) return nccl_handle(nccl(in).all_gather_v(in, out, counts));
  if (!fits(counts)) {  // each rank broadcasts its part, in pieces
    std::vector<MPI_Request> requests;
    out.narrow(0, offsets_of(counts)[rank_], counts[rank_]).copy_(in);
    broadcast_parts_from_owners(out, counts, requests);
    return labelled(Handle(std::move(requests), [in, out] {}), "all_gather_v");
  }
  const std::vector<int64_t> offsets = offsets_of(counts);
  auto displacements = std::make_shared<std::vector<int>>(offsets.begin(), offsets.end());
  auto kept_counts = std::make_shared<std::vector<int>>(counts.begin(), counts.end());
  MPI_Request request;
  MPI_Iallgatherv(in.data_ptr(), int(in.numel()), mpi_type(in), out.data_ptr(), kept_counts->data(),
                  displacements->data(), mpi_type(out), comm_, &request);
  // The count and displacement arrays must live until the operation completes.
  return labelled(Handle(request, [kept_counts, displacements, in, out] {}), "all_gather_v");
}

void Communicator::broadcast(torch::Tensor& t, int root) {
  launch_queued_messages();
  require_contiguous(t, "broadcast");
  if (stages()) {
    staged(t, t, rank_ == root, rank_ != root, [&](torch::Tensor&, torch::Tensor& host) {
      broadcast(host, root);
      return Handle();
    });
    return;
  }
  count("broadcast", bytes_of(t));
  if (size_ > 1 && t.is_cuda()) return nccl_handle(nccl(t).broadcast(t, root)).wait();
  if (size_ == 1) return;
  std::vector<MPI_Request> requests;
  for_each_piece(t.numel(), [&](int64_t offset, int n) {
    MPI_Request r;
    MPI_Ibcast(element(t, offset), n, mpi_type(t), root, comm_, &r);
    requests.push_back(r);
  });
  labelled(Handle(std::move(requests), [t] {}), "broadcast").wait();
}

void Communicator::send(const torch::Tensor& t, int destination, int tag) {
  send_async(t, destination, tag).wait();
}
void Communicator::recv(torch::Tensor& t, int source, int tag) {
  recv_async(t, source, tag).wait();
}

Handle Communicator::send_async(const torch::Tensor& t, int destination, int tag) {
  require_contiguous(t, "send");
  if (stages())
    return staged(
        t, const_cast<torch::Tensor&>(t), true, false,
        [&](torch::Tensor&, torch::Tensor& host) { return send_async(host, destination, tag); });
  count("send", bytes_of(t));
  // NCCL matches sends and receives by order per peer, not by tag; queued, they go out grouped
  // at the next wait (nccl_backend.h).
  if (t.is_cuda()) return nccl_handle(nccl(t).send(t, destination));
  if (p2p_rules_ == PointToPointRules::nccl) return queue_message(t, destination, tag, true);
  std::vector<MPI_Request> requests;  // pieces of one tag arrive in order
  for_each_piece(t.numel(), [&](int64_t offset, int n) {
    MPI_Request r;
    MPI_Isend(element(t, offset), n, mpi_type(t), destination, tag, comm_, &r);
    requests.push_back(r);
  });
  torch::Tensor keep_alive = t;  // the buffer must outlive the send
  return labelled(Handle(std::move(requests), [keep_alive] {}), "send");
}

Handle Communicator::recv_async(torch::Tensor& t, int source, int tag) {
  require_contiguous(t, "recv");
  if (stages())
    return staged(t, t, false, true, [&](torch::Tensor&, torch::Tensor& host) {
      return recv_async(host, source, tag);
    });
  count("recv", bytes_of(t));
  if (t.is_cuda()) return nccl_handle(nccl(t).recv(t, source));
  if (p2p_rules_ == PointToPointRules::nccl) return queue_message(t, source, tag, false);
  std::vector<MPI_Request> requests;
  for_each_piece(t.numel(), [&](int64_t offset, int n) {
    MPI_Request r;
    MPI_Irecv(element(t, offset), n, mpi_type(t), source, tag, comm_, &r);
    requests.push_back(r);
  });
  return labelled(Handle(std::move(requests), [t] {}), "recv");
}

Handle Communicator::queue_message(const torch::Tensor& t, int peer, int tag, bool send) {
  queued_.push_back({t, peer, tag, send});
  return Handle([this] { return launch_queued_messages(), true; },
                [this] { launch_queued_messages(); });
}

// Under PointToPointRules::nccl every collective first launches the messages queued before it
// (they come before it on the stream).
void Communicator::launch_queued_messages() {
  if (queued_.empty()) return;
  const std::vector<QueuedMessage> group = std::move(queued_);
  queued_.clear();
  std::vector<MPI_Request> requests;
  std::vector<torch::Tensor> keep_alive;
  for (const QueuedMessage& m : group) {
    keep_alive.push_back(m.tensor);
    for_each_piece(m.tensor.numel(), [&](int64_t offset, int n) {
      MPI_Request r;
      if (m.send)
        MPI_Issend(element(m.tensor, offset), n, mpi_type(m.tensor), m.peer, m.tag, comm_, &r);
      else
        MPI_Irecv(element(m.tensor, offset), n, mpi_type(m.tensor), m.peer, m.tag, comm_, &r);
      requests.push_back(r);
    });
  }
  labelled(Handle(std::move(requests), [keep_alive] {}), "point-to-point group (NCCL rules)")
      .wait();
}

void Communicator::barrier() {
  launch_queued_messages();
  count("barrier", 0);
  if (size_ == 1) return;
  MPI_Request request;
  MPI_Ibarrier(comm_, &request);
  labelled(Handle(request, nullptr), "barrier").wait();
}

Handle Communicator::labelled(Handle handle, const char* op) const {
  handle.set_label({op, &name_, comm_});
  return handle;
}

}  // namespace retort::parallel
