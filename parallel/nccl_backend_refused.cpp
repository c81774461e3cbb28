// parallel/nccl_backend_refused.cpp: the NcclBackend of a build without CUDA or NCCL (the
// libtorch 1.13 build, or RETORT_NCCL=OFF): creating one, which the first operation on a CUDA
// tensor of a directly connected group does, stops with what this build lacks. The other
// members are never reached; they are defined so the Communicator links the same either way.
#include <stdexcept>

#include "parallel/nccl_backend.h"

namespace retort::parallel {
namespace {

[[noreturn]] void refuse(const std::string& group) {
  throw std::invalid_argument("Communicator '" + group +
                              "': a CUDA tensor needs the NCCL backend, but this build has none "
                              "(configure against a CUDA libtorch with NCCL, RETORT_NCCL=AUTO "
                              "or ON)");
}

}  // namespace

NcclWork::NcclWork(std::shared_ptr<NcclBackend> backend, std::vector<torch::Tensor> tensors,
                   std::string op)
    : backend_(std::move(backend)), tensors_(std::move(tensors)), op_(std::move(op)) {}
NcclWork::~NcclWork() = default;
bool NcclWork::ready() {
  refuse(op_);
}
void NcclWork::wait() {
  refuse(op_);
}

NcclBackend::NcclBackend(MPI_Comm, int device, std::string name)
    : device_(device), name_(std::move(name)) {
  refuse(name_);
}
NcclBackend::~NcclBackend() = default;
std::shared_ptr<NcclWork> NcclBackend::all_reduce(const torch::Tensor&, NcclOp) {
  refuse(name_);
}
std::shared_ptr<NcclWork> NcclBackend::all_gather(const torch::Tensor&, const torch::Tensor&) {
  refuse(name_);
}
std::shared_ptr<NcclWork> NcclBackend::reduce_scatter(const torch::Tensor&, const torch::Tensor&) {
  refuse(name_);
}
std::shared_ptr<NcclWork> NcclBackend::reduce_scatter_v(const torch::Tensor&, const torch::Tensor&,
                                                        const std::vector<int64_t>&) {
  refuse(name_);
}
std::shared_ptr<NcclWork> NcclBackend::all_gather_v(const torch::Tensor&, const torch::Tensor&,
                                                    const std::vector<int64_t>&) {
  refuse(name_);
}
std::shared_ptr<NcclWork> NcclBackend::broadcast(const torch::Tensor&, int) {
  refuse(name_);
}
std::shared_ptr<NcclWork> NcclBackend::send(const torch::Tensor&, int) {
  refuse(name_);
}
std::shared_ptr<NcclWork> NcclBackend::recv(const torch::Tensor&, int) {
  refuse(name_);
}
void NcclBackend::flush() {}
void NcclBackend::abort() {}
void NcclBackend::record_after(NcclWork&) {}

}  // namespace retort::parallel
