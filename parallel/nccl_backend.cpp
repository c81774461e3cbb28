// parallel/nccl_backend.cpp: see nccl_backend.h.
#include "parallel/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace retort::parallel {
namespace {

void check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess)
    throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(result));
}

void check(cudaError_t result, const char* what) {
  if (result != cudaSuccess)
    throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(result));
}

ncclDataType_t nccl_type(NcclType t) {
  switch (t) {
    case NcclType::Float32:
      return ncclFloat32;
    case NcclType::Float64:
      return ncclFloat64;
    case NcclType::Int64:
      return ncclInt64;
    case NcclType::Int32:
      return ncclInt32;
    case NcclType::UInt8:
      return ncclUint8;
    case NcclType::BFloat16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

}  // namespace

struct NcclBackend::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

NcclBackend::NcclBackend(MPI_Comm group) : state_(std::make_unique<State>()) {
  int rank = 0, size = 1;
  MPI_Comm_rank(group, &rank);
  MPI_Comm_size(group, &size);
  ncclUniqueId id;
  if (rank == 0) check(ncclGetUniqueId(&id), "get unique id");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, group);
  check(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking), "stream create");
  check(ncclCommInitRank(&state_->comm, size, id, rank), "init rank");
}

NcclBackend::~NcclBackend() {
  if (state_->comm) ncclCommDestroy(state_->comm);
  if (state_->stream) cudaStreamDestroy(state_->stream);
}

void NcclBackend::all_reduce(void* data, size_t count, NcclType type, NcclOp op) {
  check(ncclAllReduce(data, data, count, nccl_type(type), op == NcclOp::Sum ? ncclSum : ncclMax,
                      state_->comm, state_->stream),
        "all_reduce");
}

void NcclBackend::all_gather(const void* in, void* out, size_t count, NcclType type) {
  check(ncclAllGather(in, out, count, nccl_type(type), state_->comm, state_->stream), "all_gather");
}

void NcclBackend::reduce_scatter(const void* in, void* out, size_t count, NcclType type) {
  check(ncclReduceScatter(in, out, count, nccl_type(type), ncclSum, state_->comm, state_->stream),
        "reduce_scatter");
}

void NcclBackend::broadcast(void* data, size_t count, NcclType type, int root) {
  check(ncclBroadcast(data, data, count, nccl_type(type), root, state_->comm, state_->stream),
        "broadcast");
}

void NcclBackend::send(const void* data, size_t count, NcclType type, int peer) {
  check(ncclSend(data, count, nccl_type(type), peer, state_->comm, state_->stream), "send");
}

void NcclBackend::recv(void* data, size_t count, NcclType type, int peer) {
  check(ncclRecv(data, count, nccl_type(type), peer, state_->comm, state_->stream), "recv");
}

void NcclBackend::synchronize() {
  check(cudaStreamSynchronize(state_->stream), "synchronize");
}

}  // namespace retort::parallel
