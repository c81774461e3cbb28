// parallel/communicator.cpp: see communicator.h.
#include "parallel/communicator.h"

#include <stdexcept>

#include "parallel/device_backend.h"

namespace retort::parallel {
namespace {

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
// `handle` (a reduction into `buffer`), then the float32 sum copied back into `target`,
// rounding once; `handle` itself where nothing was widened.
Handle rounded_back(Handle handle, const torch::Tensor& target, const torch::Tensor& buffer) {
  if (buffer.is_same(target)) return handle;
  return std::move(handle).then([target, buffer]() mutable { target.copy_(buffer); });
}

int64_t bytes_of(const torch::Tensor& t) {
  return t.numel() * t.element_size();
}

// A group of one: the collective's result is its input (no MPI call).
bool copied_when_alone(int size, const torch::Tensor& in, torch::Tensor& out) {
  if (size != 1) return false;
  out.view({-1}).copy_(in.reshape({-1}));
  return true;
}

int rank_in(MPI_Comm comm) {
  int rank = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_rank(comm, &rank);
  return rank;
}
int size_of(MPI_Comm comm) {
  int size = 1;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &size);
  return size;
}

}  // namespace

Communicator::Communicator(MPI_Comm comm, std::string name)
    : comm_(comm),
      name_(std::move(name)),
      rank_(rank_in(comm)),
      size_(size_of(comm)),
      mpi_(comm_, rank_, size_, name_),
      staged_(mpi_, rank_) {}

std::unique_ptr<Communicator> Communicator::single(std::string name) {
  return std::unique_ptr<Communicator>(new Communicator(std::move(name)));
}

Communicator& Communicator::one_process() {
  static const std::unique_ptr<Communicator> group = single("one process");
  return *group;
}

Communicator::Communicator(std::string name) : Communicator(MPI_COMM_NULL, std::move(name)) {}

Communicator::~Communicator() {
  if (comm_ == MPI_COMM_NULL) return;  // a single-process group owns no MPI communicator
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
}

Backend& Communicator::backend_for(const torch::Tensor& t) {
  if (transport_ == Transport::host_staged) return staged_;
  if (!t.is_cuda()) return mpi_;
  if (!device_) device_ = std::make_unique<DeviceBackend>(comm_, int(t.device().index()), name_);
  if (device_->device() != t.device().index())
    throw std::invalid_argument("Communicator '" + name_ + "': a tensor on " + t.device().str() +
                                ", but the group's NCCL communicator is on GPU " +
                                std::to_string(device_->device()));
  return *device_;
}

void Communicator::count(const std::string& op, int64_t bytes) {
  OpCounter& c = counters_[op];
  c.calls += 1;
  c.bytes += bytes;
}

void Communicator::all_reduce(torch::Tensor& t, ReduceOp op) {
  all_reduce_async(t, op).wait();
}

Handle Communicator::all_reduce_async(torch::Tensor& t, ReduceOp op) {
  mpi_.launch_queued_messages();
  require_contiguous(t, "all_reduce");
  if (size_ == 1) {
    count("all_reduce", bytes_of(t));
    return {};
  }
  torch::Tensor buffer = sum_buffer(t, op);
  count("all_reduce", bytes_of(buffer));
  return rounded_back(backend_for(t).all_reduce(buffer, op), t, buffer);
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
  mpi_.launch_queued_messages();
  require_contiguous(in, "all_gather");
  require_contiguous(out, "all_gather");
  count("all_gather", bytes_of(out));
  if (copied_when_alone(size_, in, out)) return {};
  return backend_for(in).all_gather(in, out);
}

Handle Communicator::reduce_scatter_flat_async(const torch::Tensor& in, torch::Tensor& out,
                                               ReduceOp op) {
  mpi_.launch_queued_messages();
  require_contiguous(in, "reduce_scatter");
  require_contiguous(out, "reduce_scatter");
  if (op == ReduceOp::Max) throw std::invalid_argument("reduce_scatter: sums only");
  if (copied_when_alone(size_, in, out)) {
    count("reduce_scatter", bytes_of(in));
    return {};
  }
  const torch::Tensor wide_in = sum_buffer(in, op);
  torch::Tensor wide_out = sum_buffer(out, op);
  count("reduce_scatter", bytes_of(wide_in));
  return rounded_back(backend_for(in).reduce_scatter(wide_in, wide_out, op), out, wide_out);
}

Handle Communicator::reduce_scatter_v_async(const torch::Tensor& in, torch::Tensor& out,
                                            const std::vector<int64_t>& counts, ReduceOp op) {
  mpi_.launch_queued_messages();
  require_contiguous(in, "reduce_scatter_v");
  require_contiguous(out, "reduce_scatter_v");
  if (copied_when_alone(size_, in, out)) {
    count("reduce_scatter", bytes_of(in));
    return {};
  }
  const torch::Tensor wide_in = sum_buffer(in, op);
  torch::Tensor wide_out = sum_buffer(out, op);
  count("reduce_scatter", bytes_of(wide_in));
  return rounded_back(backend_for(in).reduce_scatter_v(wide_in, wide_out, counts, op), out,
                      wide_out);
}

Handle Communicator::all_gather_v_async(const torch::Tensor& in, torch::Tensor& out,
                                        const std::vector<int64_t>& counts) {
  mpi_.launch_queued_messages();
  require_contiguous(in, "all_gather_v");
  require_contiguous(out, "all_gather_v");
  count("all_gather", bytes_of(out));
  if (copied_when_alone(size_, in, out)) return {};
  return backend_for(in).all_gather_v(in, out, counts);
}

void Communicator::broadcast(torch::Tensor& t, int root) {
  mpi_.launch_queued_messages();
  require_contiguous(t, "broadcast");
  count("broadcast", bytes_of(t));
  if (size_ == 1) return;
  backend_for(t).broadcast(t, root).wait();
}

void Communicator::send(const torch::Tensor& t, int destination, int tag) {
  send_async(t, destination, tag).wait();
}
void Communicator::recv(torch::Tensor& t, int source, int tag) {
  recv_async(t, source, tag).wait();
}

Handle Communicator::send_async(const torch::Tensor& t, int destination, int tag) {
  require_contiguous(t, "send");
  count("send", bytes_of(t));
  return backend_for(t).send(t, destination, tag);
}

Handle Communicator::recv_async(torch::Tensor& t, int source, int tag) {
  require_contiguous(t, "recv");
  count("recv", bytes_of(t));
  return backend_for(t).recv(t, source, tag);
}

void Communicator::barrier() {
  mpi_.launch_queued_messages();
  count("barrier", 0);
  if (size_ == 1) return;
  mpi_.barrier().wait();
}

}  // namespace retort::parallel
