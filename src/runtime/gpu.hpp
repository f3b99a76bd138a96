// This rank's GPU: how many it sees, and which one it uses. One GPU per rank, chosen by node-local
// rank: device = local rank mod visible devices (with one visible device per rank, Slurm
// --gpus-per-task=1 or CUDA_VISIBLE_DEVICES, that is device 0). The node-local rank comes from the
// launcher (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, PMI_LOCAL_RANK); without one,
// it is the rank's position among the ranks of its host. With more ranks than GPUs on a node, ranks
// share a GPU; placement.hpp then gives their group the MPI reducer (NCCL takes one GPU per rank).
// Builds without the CUDA kernels (no nvcc) see no GPU. Every raw CUDA runtime call of src/runtime
// but the NCCL reducer's stream is made here.
#pragma once

#include <cstddef>
#include <string>

#include "src/runtime/mpi.hpp"

namespace fastudy {

// The node-local rank from the launcher's environment, or -1 when no launcher variable is set.
int local_rank_from_env();

// Visible CUDA devices; 0 when there is none, no driver or no CUDA in this build (why says which).
int visible_gpus(std::string* why = nullptr);

// Whether this rank can train on a GPU: the build's LibTorch has CUDA (FASTUDY_TORCH_CUDA) and the rank
// sees a device (why, if given, says what is missing).
bool rank_has_gpu(std::string* why = nullptr);

// Chooses and makes current (cudaSetDevice) this rank's GPU as described above; returns its index.
// Collective over comm only when the environment names no local rank (hostnames are gathered: the
// rank's position among comm's ranks on its host). Throws UsageError naming the rank when it sees no GPU.
int select_gpu(const mpi::Comm& comm);

// Makes `device` this rank's current CUDA device (cudaSetDevice); UsageError when it is not visible.
void use_gpu(int device);

// The PCI bus id of a visible device ("0000:3b:00.0"): what tells two GPUs of one host apart (NCCL's
// identity of a GPU); "" in a build without CUDA.
std::string gpu_bus_id(int device);

// The current CUDA device (cudaGetDevice); -1 without CUDA or a device.
int current_gpu();

// Whether p is device (or managed) memory (cudaPointerGetAttributes); false without CUDA or a device.
bool is_device_pointer(const void* p);
// Synchronous copies between host and device memory (cudaMemcpy); Error in a build without CUDA.
void copy_device_to_host(void* host, const void* device, std::size_t bytes);
void copy_host_to_device(void* device, const void* host, std::size_t bytes);

}  // namespace fastudy
