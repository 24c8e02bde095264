#include "worker/parallel/collective.h"

#include <gloo/rendezvous/store.h>

#include <vector>

#include "common/error.h"
#include "worker/compute_device.h"
#include "worker/parallel/gloo_group.h"
#ifdef LAZYKV_HAVE_NCCL
#include "worker/parallel/nccl/nccl_group.h"
#endif

namespace lazykv {
namespace {

std::string rank_key(int rank) { return "lazykv_collective_rank_" + std::to_string(rank); }

// Every rank's choice, compared before any communicator is built: ranks that
// chose differently would otherwise each wait for peers that never come.
void check_ranks_agree(const GroupSpec& spec, gloo::rendezvous::Store& store) {
  const std::string mine = collective_name(spec.collective);
  std::vector<std::string> keys;
  try {
    store.set(rank_key(spec.rank), std::vector<char>(mine.begin(), mine.end()));
    for (int r = 0; r < spec.world; ++r) {
      if (r != spec.rank) keys.push_back(rank_key(r));
    }
    store.wait(keys, spec.timeout);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, "tensor-parallel rank " + std::to_string(spec.rank) + " of " +
                                             std::to_string(spec.world) + ": rendezvous failed: " + e.what());
  }
  for (int r = 0; r < spec.world; ++r) {
    if (r == spec.rank) continue;
    const std::vector<char> theirs_bytes = store.get(rank_key(r));
    const std::string theirs(theirs_bytes.begin(), theirs_bytes.end());
    if (theirs != mine) {
      throw Error(ErrorCode::kInvalidArgument, "tensor-parallel rank " + std::to_string(spec.rank) + " uses --collective " +
                                                   mine + " but rank " + std::to_string(r) + " uses " + theirs +
                                                   ": every rank of a group must use the same one");
    }
  }
}

}  // namespace

Collective parse_collective(std::string_view name) {
  if (name == "gloo") return Collective::kGloo;
  if (name == "nccl") return Collective::kNccl;
  throw Error(ErrorCode::kInvalidArgument, "unknown collective '" + std::string(name) + "' (valid: gloo, nccl)");
}

const char* collective_name(Collective collective) { return collective == Collective::kNccl ? "nccl" : "gloo"; }

bool nccl_built() {
#ifdef LAZYKV_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

int check_collective(const GroupSpec& spec) {
  if (spec.collective == Collective::kGloo) return -1;
  if (spec.cuda_device < -1) {
    throw Error(ErrorCode::kInvalidArgument, "--cuda-device must be >= 0, or -1 for rank modulo the devices");
  }
#ifdef LAZYKV_HAVE_NCCL
  return pick_cuda_device(spec.cuda_device, spec.rank, "--collective nccl");
#else
  throw Error(ErrorCode::kUnavailable,
              "--collective nccl: this lazykv was built without NCCL (CMake found no CUDA toolkit with NCCL); "
              "use --collective gloo");
#endif
}

std::unique_ptr<TensorParallelGroup> form_group(const GroupSpec& spec, gloo::rendezvous::Store& store) {
  if (spec.world < 1 || spec.rank < 0 || spec.rank >= spec.world) {
    throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: rank " + std::to_string(spec.rank) +
                                                 " is outside a world of " + std::to_string(spec.world));
  }
  // Agreement first, so that ranks that chose differently both say so, even
  // where one of them could not carry its choice.
  check_ranks_agree(spec, store);
  const int device = check_collective(spec);
  if (spec.collective == Collective::kGloo) {
    GlooGroupOptions options;
    options.rank = spec.rank;
    options.world = spec.world;
    options.hostname = spec.hostname;
    options.timeout = spec.timeout;
    return std::make_unique<GlooGroup>(options, store);
  }
#ifdef LAZYKV_HAVE_NCCL
  NcclGroupOptions options;
  options.rank = spec.rank;
  options.world = spec.world;
  options.device = device;
  options.timeout = spec.timeout;
  return std::make_unique<NcclGroup>(options, store);
#else
  (void)device;  // check_collective threw already
  throw Error(ErrorCode::kInternal, "unreachable: NCCL without an NCCL build");
#endif
}

}  // namespace lazykv
