// parallel/mpi_backend.cpp: see mpi_backend.h.
#include "parallel/mpi_backend.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

namespace retort::parallel {
namespace {

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
    case torch::kBFloat16:  // moved as bits; only a SumNarrow adds them as they are
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

MpiBackend::MpiBackend(MPI_Comm comm, int rank, int size, const std::string& name)
    : comm_(comm), rank_(rank), size_(size), name_(name) {}

int64_t MpiBackend::max_elements_per_call() {
  return max_elements;
}
void MpiBackend::set_max_elements_per_call(int64_t elements) {
  if (elements < 1 || elements > std::numeric_limits<int>::max())
    throw std::invalid_argument("max_elements_per_call must be in [1, INT_MAX]");
  max_elements = elements;
}

Handle MpiBackend::labelled(Handle handle, const char* op) const {
  handle.set_label({op, &name_, comm_});
  return handle;
}

void MpiBackend::reduce_parts_to_owners(const torch::Tensor& in, torch::Tensor& out,
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

void MpiBackend::broadcast_parts_from_owners(torch::Tensor& out, const std::vector<int64_t>& counts,
                                             std::vector<MPI_Request>& requests) {
  const std::vector<int64_t> offsets = offsets_of(counts);
  for (int root = 0; root < size_; ++root)
    for_each_piece(counts[root], [&](int64_t offset, int n) {
      MPI_Request r;
      MPI_Ibcast(element(out, offsets[root] + offset), n, mpi_type(out), root, comm_, &r);
      requests.push_back(r);
    });
}

Handle MpiBackend::all_reduce(torch::Tensor& buffer, ReduceOp op) {
  std::vector<MPI_Request> requests;
  for_each_piece(buffer.numel(), [&](int64_t offset, int n) {
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, element(buffer, offset), n, mpi_type(buffer), mpi_op(op, buffer),
                   comm_, &r);
    requests.push_back(r);
  });
  return labelled(Handle(std::move(requests), [buffer] {}), "all_reduce");
}

Handle MpiBackend::all_gather(const torch::Tensor& in, torch::Tensor& out) {
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

Handle MpiBackend::reduce_scatter(const torch::Tensor& in, torch::Tensor& out, ReduceOp op) {
  if (out.numel() > max_elements) {  // each rank's part reduced onto it, in pieces
    std::vector<MPI_Request> requests;
    reduce_parts_to_owners(in, out, std::vector<int64_t>(size_, out.numel()), requests,
                           mpi_op(op, in));
    return labelled(Handle(std::move(requests), [in, out] {}), "reduce_scatter");
  }
  MPI_Request request;
  MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), int(out.numel()), mpi_type(in),
                            mpi_op(op, in), comm_, &request);
  return labelled(Handle(request, [in, out] {}), "reduce_scatter");
}

Handle MpiBackend::reduce_scatter_v(const torch::Tensor& in, torch::Tensor& out,
                                    const std::vector<int64_t>& counts, ReduceOp op) {
  if (!fits(counts)) {
    std::vector<MPI_Request> requests;
    reduce_parts_to_owners(in, out, counts, requests, mpi_op(op, in));
    return labelled(Handle(std::move(requests), [in, out] {}), "reduce_scatter_v");
  }
  // The count array must live until the operation completes.
  auto int_counts = std::make_shared<std::vector<int>>(counts.begin(), counts.end());
  MPI_Request request;
  MPI_Ireduce_scatter(in.data_ptr(), out.data_ptr(), int_counts->data(), mpi_type(in),
                      mpi_op(op, in), comm_, &request);
  return labelled(Handle(request, [int_counts, in, out] {}), "reduce_scatter_v");
}

Handle MpiBackend::all_gather_v(const torch::Tensor& in, torch::Tensor& out,
                                const std::vector<int64_t>& counts) {
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

Handle MpiBackend::broadcast(torch::Tensor& t, int root) {
  std::vector<MPI_Request> requests;
  for_each_piece(t.numel(), [&](int64_t offset, int n) {
    MPI_Request r;
    MPI_Ibcast(element(t, offset), n, mpi_type(t), root, comm_, &r);
    requests.push_back(r);
  });
  return labelled(Handle(std::move(requests), [t] {}), "broadcast");
}

Handle MpiBackend::send(const torch::Tensor& t, int destination, int tag) {
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

Handle MpiBackend::recv(torch::Tensor& t, int source, int tag) {
  if (p2p_rules_ == PointToPointRules::nccl) return queue_message(t, source, tag, false);
  std::vector<MPI_Request> requests;
  for_each_piece(t.numel(), [&](int64_t offset, int n) {
    MPI_Request r;
    MPI_Irecv(element(t, offset), n, mpi_type(t), source, tag, comm_, &r);
    requests.push_back(r);
  });
  return labelled(Handle(std::move(requests), [t] {}), "recv");
}

Handle MpiBackend::queue_message(const torch::Tensor& t, int peer, int tag, bool send) {
  queued_.push_back({t, peer, tag, send});
  return Handle([this] { return launch_queued_messages(), true; },
                [this] { launch_queued_messages(); });
}

void MpiBackend::launch_queued_messages() {
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

Handle MpiBackend::barrier() {
  MPI_Request request;
  MPI_Ibarrier(comm_, &request);
  return labelled(Handle(request, nullptr), "barrier");
}

}  // namespace retort::parallel
