// --kvstore and the in-process tier flags: where the lazy+tiers policy
// demotes evicted blocks. Every command that runs a model takes them.
#include "cli/commands.h"
#include "common/error.h"
#include "worker/tiers/tier_mover.h"

namespace lazykv {

void add_tier_flags(Flags& flags) {
  flags.add("kvstore", "", "HOST:PORT of a `lazykv kvstore` for lazy+tiers (empty: in-process tiers)")
      .add("kvstore-transports", "", "UCX transports to the kvstore (UCX_TLS syntax; empty: UCX chooses)")
      .add("host-tier-mib", "256", "in-process tier 1 (host DRAM) for lazy+tiers, without --kvstore")
      .add("nvme-tier-path", "", "in-process tier 2 (RocksDB directory) for lazy+tiers (empty: none)")
      .add("nvme-tier-mib", "4096", "in-process tier 2 capacity");
}

void configure_tiers_from_flags(const Flags& flags) {
  tiers::TierConfig config;
  config.kvstore_address = flags.get("kvstore");
  config.transports = flags.get("kvstore-transports");
  const int64_t host_mib = flags.get_int("host-tier-mib");
  const int64_t nvme_mib = flags.get_int("nvme-tier-mib");
  if (host_mib < 1) throw Error(ErrorCode::kInvalidArgument, "--host-tier-mib must be >= 1");
  if (nvme_mib < 1) throw Error(ErrorCode::kInvalidArgument, "--nvme-tier-mib must be >= 1");
  config.host_tier_bytes = uint64_t(host_mib) << 20;
  config.nvme_path = flags.get("nvme-tier-path");
  config.nvme_tier_bytes = uint64_t(nvme_mib) << 20;
  tiers::configure_tiers(config);
}

}  // namespace lazykv
