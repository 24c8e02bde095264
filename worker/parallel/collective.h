// Which library carries a tensor-parallel group's collectives, and forming a
// group of that kind: Gloo over TCP (the CPU all-reduce, always built) or
// NCCL (the GPU all-reduce, built where the CUDA toolkit ships NCCL). Every
// rank of a group must choose the same one; form_group checks that through the
// rendezvous store first, so a mismatch is a clear error, not a hang.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "worker/parallel/group.h"

namespace gloo::rendezvous {
class Store;
}

namespace lazykv {

enum class Collective { kGloo, kNccl };

// "gloo" or "nccl"; anything else is Error(kInvalidArgument) listing both.
Collective parse_collective(std::string_view name);
const char* collective_name(Collective collective);

// Whether this binary was built with NCCL.
bool nccl_built();

struct GroupSpec {
  Collective collective = Collective::kGloo;
  int rank = 0;
  int world = 1;
  std::string hostname = "127.0.0.1";  // Gloo: where this rank's peers reach it
  int cuda_device = -1;                // NCCL: this rank's device; -1: rank modulo the devices
  std::chrono::milliseconds timeout{30000};
};

// Checks that this process can carry `spec`'s collective before any peer is
// waited for, and returns the CUDA device an NCCL group would use (-1 for
// Gloo). NCCL without an NCCL build, or without a usable CUDA device, or with
// a device outside those present, is Error(kUnavailable) saying which; a
// negative device other than -1 is Error(kInvalidArgument).
int check_collective(const GroupSpec& spec);

// Forms the group: every rank publishes its collective's name and compares the
// others' (Error(kInvalidArgument) naming the ranks that differ), checks it as
// check_collective does, then builds the communicator (errors as GlooGroup's
// and NcclGroup's constructors).
std::unique_ptr<TensorParallelGroup> form_group(const GroupSpec& spec, gloo::rendezvous::Store& store);

}  // namespace lazykv
