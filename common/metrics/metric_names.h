// Every metric lazykv exports, in one place. Naming rules (Prometheus'):
//   - prefix lazykv_, snake_case;
//   - counters end in _total;
//   - a unit, when there is one, is the suffix before _total, in base units
//     (_seconds, _bytes, _tokens); no abbreviations;
//   - labels are low-cardinality: tier, worker, replica, endpoint, type, code; never
//     a request id or a prompt.
// Tiers: "device" (tier 0, the budgeted KV cache), "host", "nvme".
// docs/metrics.md describes each one; tests/unit/metrics checks the rules and
// runs promtool over a fully populated registry.
#pragma once

#include <array>
#include <span>
#include <string_view>

namespace lazykv::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

struct MetricDef {
  std::string_view name;
  MetricType type;
  std::string_view help;
  std::span<const std::string_view> label_names;
  std::span<const double> buckets;  // histograms: upper bounds, increasing (+Inf is implied)
};

// Bucket layouts.
inline constexpr double kLatencyBuckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                             0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
inline constexpr double kRequestBuckets[] = {0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0};
inline constexpr double kBatchBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
inline constexpr double kStepTokenBuckets[] = {1, 4, 16, 64, 256, 1024, 4096};

// Label sets.
inline constexpr std::string_view kNoLabels[] = {""};
inline constexpr std::string_view kTierLabel[] = {"tier"};
inline constexpr std::string_view kTransferLabels[] = {"src_tier", "dst_tier"};
inline constexpr std::string_view kWorkerLabel[] = {"worker"};
inline constexpr std::string_view kTypeLabel[] = {"type"};
inline constexpr std::string_view kPhaseLabel[] = {"phase"};
inline constexpr std::string_view kRequestLabels[] = {"endpoint", "code"};
inline constexpr std::string_view kBuildLabels[] = {"version", "model"};
inline constexpr std::string_view kTransportLabel[] = {"transport"};
inline constexpr std::string_view kReplicaLabel[] = {"replica"};
inline constexpr std::string_view kRouterRequestLabels[] = {"replica", "code"};

constexpr std::span<const std::string_view> no_labels() { return std::span<const std::string_view>(kNoLabels, 0); }
constexpr std::span<const double> no_buckets() { return {}; }

// --- requests (coordinator) ---------------------------------------------------
inline constexpr MetricDef kTimeToFirstToken{
    "lazykv_time_to_first_token_seconds", MetricType::kHistogram,
    "Time from a request's arrival to its first generated token.", no_labels(), kLatencyBuckets};
inline constexpr MetricDef kInterTokenLatency{
    "lazykv_inter_token_latency_seconds", MetricType::kHistogram,
    "Time between consecutive generated tokens of one sequence.", no_labels(), kLatencyBuckets};
inline constexpr MetricDef kRequestDuration{
    "lazykv_request_duration_seconds", MetricType::kHistogram,
    "End-to-end time of a generation request, arrival to last byte.", no_labels(), kRequestBuckets};
inline constexpr MetricDef kRequestsRunning{
    "lazykv_requests_running", MetricType::kGauge, "Sequences in the running batch.", no_labels(), no_buckets()};
inline constexpr MetricDef kRequestsWaiting{
    "lazykv_requests_waiting", MetricType::kGauge, "Sequences queued for admission.", no_labels(), no_buckets()};
inline constexpr MetricDef kRequests{
    "lazykv_requests_total", MetricType::kCounter, "API requests answered (HTTP and gRPC), by endpoint and status code.",
    kRequestLabels, no_buckets()};
inline constexpr MetricDef kPromptTokens{
    "lazykv_prompt_tokens_total", MetricType::kCounter, "Prompt tokens admitted for prefill.", no_labels(),
    no_buckets()};
inline constexpr MetricDef kGenerationTokens{
    "lazykv_generation_tokens_total", MetricType::kCounter, "Tokens generated.", no_labels(), no_buckets()};
inline constexpr MetricDef kReasoningTokens{
    "lazykv_reasoning_tokens_total", MetricType::kCounter,
    "Tokens generated inside a chat reply's thinking block (counted in lazykv_generation_tokens_total too).",
    no_labels(), no_buckets()};
inline constexpr MetricDef kPreemptions{
    "lazykv_preemptions_total", MetricType::kCounter,
    "Running sequences preempted for lack of KV memory (requeued, recomputed on readmission).", no_labels(),
    no_buckets()};
inline constexpr MetricDef kSequencesMoved{
    "lazykv_sequences_moved_total", MetricType::kCounter,
    "Sequences that had sent no token when their group's worker died, moved to another group (--group).",
    no_labels(), no_buckets()};
inline constexpr MetricDef kErrors{
    "lazykv_errors_total", MetricType::kCounter,
    "Requests that ended in an error, by type (invalid_request, authentication, overloaded, cancelled, "
    "worker, internal).",
    kTypeLabel, no_buckets()};

// --- KV memory and tiers --------------------------------------------------------
inline constexpr MetricDef kKvSlots{
    "lazykv_kv_slots", MetricType::kGauge, "Cached token slots (summed over layers and KV heads), by tier.",
    kTierLabel, no_buckets()};
inline constexpr MetricDef kKvBytes{
    "lazykv_kv_bytes", MetricType::kGauge, "Bytes of KV memory in use, by tier.", kTierLabel, no_buckets()};
inline constexpr MetricDef kKvPoolBytes{
    "lazykv_kv_pool_bytes", MetricType::kGauge,
    "Bytes the KV page pool holds, in use or free (it keeps its high-water mark), by tier.", kTierLabel,
    no_buckets()};
inline constexpr MetricDef kKvCapacityBytes{
    "lazykv_kv_capacity_bytes", MetricType::kGauge, "KV memory capacity, by tier.", kTierLabel, no_buckets()};
inline constexpr MetricDef kEvictions{
    "lazykv_evictions_total", MetricType::kCounter, "Token slots evicted from the device KV cache by the policy.",
    no_labels(), no_buckets()};
inline constexpr MetricDef kEvictionsByPhase{
    "lazykv_evictions_by_phase_total", MetricType::kCounter,
    "Token slots evicted, by the phase of the chat reply whose policy evicted them (thinking, answer).",
    kPhaseLabel, no_buckets()};
inline constexpr MetricDef kDemotions{
    "lazykv_demotions_total", MetricType::kCounter, "Evicted token slots demoted to a lower tier.", no_labels(),
    no_buckets()};
inline constexpr MetricDef kPromotions{
    "lazykv_promotions_total", MetricType::kCounter, "Token slots promoted back to the device KV cache.",
    no_labels(), no_buckets()};
inline constexpr MetricDef kPromotionHits{
    "lazykv_promotion_hits_total", MetricType::kCounter,
    "Promoted token slots that received attention after promotion.", no_labels(), no_buckets()};
inline constexpr MetricDef kTransferBytes{
    "lazykv_transfer_bytes_total", MetricType::kCounter, "Bytes moved between tiers.", kTransferLabels,
    no_buckets()};
inline constexpr MetricDef kTransferDuration{
    "lazykv_transfer_duration_seconds", MetricType::kHistogram, "Time of one block transfer between tiers.",
    kTransferLabels, kLatencyBuckets};

// --- prompt KV reuse ---------------------------------------------------------------
inline constexpr MetricDef kPrefixCacheHitTokens{
    "lazykv_prefix_cache_hit_tokens_total", MetricType::kCounter,
    "Prompt tokens whose KV a worker took from its prefix cache instead of computing it.", no_labels(),
    no_buckets()};
inline constexpr MetricDef kPrefixCacheHitBytes{
    "lazykv_prefix_cache_hit_bytes_total", MetricType::kCounter,
    "KV bytes taken from the prefix cache (hit tokens in every layer and KV head).", no_labels(), no_buckets()};
inline constexpr MetricDef kPrefixCacheSavedSeconds{
    "lazykv_prefix_cache_saved_seconds_total", MetricType::kCounter,
    "Prefill time the prefix cache saved, estimated: hit tokens times the fitted prefill seconds per token.",
    no_labels(), no_buckets()};
inline constexpr MetricDef kPrefixCacheFetchedBytes{
    "lazykv_prefix_cache_fetched_bytes_total", MetricType::kCounter,
    "Bytes of prompt blocks fetched from the tiers (kvstore, host, NVMe) into the prefix cache "
    "(--prefix-cache-tiers).",
    no_labels(), no_buckets()};
inline constexpr MetricDef kPrefixCacheFetchSeconds{
    "lazykv_prefix_cache_fetch_seconds_total", MetricType::kCounter,
    "Time steps spent fetching prompt blocks from the tiers (blocks found and missed).", no_labels(), no_buckets()};
inline constexpr MetricDef kPrefixCacheBytes{
    "lazykv_prefix_cache_bytes", MetricType::kGauge,
    "Bytes of prompt KV pages the prefix cache holds (shared with running sequences or not).", no_labels(),
    no_buckets()};

// --- kvstore ---------------------------------------------------------------------
inline constexpr MetricDef kKvstoreBlocks{
    "lazykv_kvstore_blocks", MetricType::kGauge, "Demoted KV blocks held by the kvstore, by tier (host, nvme).",
    kTierLabel, no_buckets()};
inline constexpr MetricDef kKvstoreLeases{
    "lazykv_kvstore_leases", MetricType::kGauge,
    "Blocks leased to an in-flight transfer (put reservations and read leases).", no_labels(), no_buckets()};
inline constexpr MetricDef kKvstorePoolFragmentation{
    "lazykv_kvstore_host_pool_fragmentation_ratio", MetricType::kGauge,
    "1 - largest free run / free bytes of the host pool (0: one free run).", no_labels(), no_buckets()};
inline constexpr MetricDef kKvstoreRequests{
    "lazykv_kvstore_requests_total", MetricType::kCounter,
    "kvstore requests, by operation (endpoint: put, get, drop, drop_sequence, stats) and outcome code.", kRequestLabels, no_buckets()};
inline constexpr MetricDef kKvstoreNvmeAdmissions{
    "lazykv_kvstore_nvme_admissions_total", MetricType::kCounter,
    "Blocks leaving the host tier, by decision (admitted to nvme, or rejected by the admission rule), and nvme "
    "blocks evicted to make room for admitted ones.", kTypeLabel,
    no_buckets()};
inline constexpr MetricDef kTransportInfo{
    "lazykv_transport_info", MetricType::kGauge,
    "Open UCX connections, by the transport UCX chose (tcp, shm, rdma, cuda...).", kTransportLabel, no_buckets()};

// --- workers ---------------------------------------------------------------------
inline constexpr MetricDef kStepDuration{
    "lazykv_step_duration_seconds", MetricType::kHistogram, "Time of one scheduler step on a worker.",
    kWorkerLabel, kLatencyBuckets};
inline constexpr MetricDef kStepBatchSize{
    "lazykv_step_batch_size", MetricType::kHistogram, "Sequences in one scheduler step.", kWorkerLabel,
    kBatchBuckets};
inline constexpr MetricDef kStepTokens{
    "lazykv_step_tokens", MetricType::kHistogram, "Tokens (prefill and decode) in one scheduler step.",
    kWorkerLabel, kStepTokenBuckets};
inline constexpr MetricDef kWorkerUp{
    "lazykv_worker_up", MetricType::kGauge, "1 while a worker answers heartbeats, 0 once it is declared dead.",
    kWorkerLabel, no_buckets()};
inline constexpr MetricDef kBuildInfo{
    "lazykv_build_info", MetricType::kGauge, "Always 1; the labels name the version and the served model.",
    kBuildLabels, no_buckets()};

// --- router (lazykv router) -------------------------------------------------------
// replica: the replica's address as given to --replica ("none" where the
// router answered itself).
inline constexpr MetricDef kRouterRequests{
    "lazykv_router_requests_total", MetricType::kCounter,
    "Requests the router answered, by the replica that served them and HTTP status code.", kRouterRequestLabels,
    no_buckets()};
inline constexpr MetricDef kRouterRoutes{
    "lazykv_router_routes_total", MetricType::kCounter,
    "Requests bound to a replica, by why: affinity (it served the prompt's prefix recently) or least_loaded.",
    kTypeLabel, no_buckets()};
inline constexpr MetricDef kRouterRetries{
    "lazykv_router_retries_total", MetricType::kCounter,
    "Requests moved to another replica because this one could not be reached before it took them.", kReplicaLabel,
    no_buckets()};
inline constexpr MetricDef kRouterReplicaUp{
    "lazykv_router_replica_up", MetricType::kGauge,
    "1 while a replica answers its readiness probe, 0 once a probe or a connection fails.", kReplicaLabel,
    no_buckets()};
inline constexpr MetricDef kRouterInFlight{
    "lazykv_router_in_flight_requests", MetricType::kGauge, "Requests the router has sent to a replica and not finished.",
    kReplicaLabel, no_buckets()};
inline constexpr MetricDef kRouterOutstandingTokens{
    "lazykv_router_outstanding_tokens", MetricType::kGauge,
    "Estimated prompt plus generated tokens of a replica's requests in flight (the load the router balances).",
    kReplicaLabel, no_buckets()};
inline constexpr MetricDef kRouterWaiting{
    "lazykv_router_waiting_requests", MetricType::kGauge, "Requests waiting in the router for a replica's free slot.",
    no_labels(), no_buckets()};

// Every metric, in exposition order.
inline constexpr std::array<const MetricDef*, 47> kAllMetrics = {
    &kTimeToFirstToken, &kInterTokenLatency, &kRequestDuration, &kRequestsRunning, &kRequestsWaiting,
    &kRequests,         &kPromptTokens,      &kGenerationTokens, &kReasoningTokens, &kPreemptions,
    &kSequencesMoved,   &kErrors,
    &kKvSlots,          &kKvBytes,           &kKvPoolBytes,      &kKvCapacityBytes,  &kEvictions,
    &kEvictionsByPhase, &kDemotions,
    &kPromotions,       &kPromotionHits,     &kTransferBytes,    &kTransferDuration,
    &kPrefixCacheHitTokens, &kPrefixCacheHitBytes, &kPrefixCacheSavedSeconds, &kPrefixCacheFetchedBytes,
    &kPrefixCacheFetchSeconds, &kPrefixCacheBytes, &kKvstoreBlocks,
    &kKvstoreLeases,    &kKvstorePoolFragmentation, &kKvstoreRequests, &kKvstoreNvmeAdmissions, &kTransportInfo,
    &kStepDuration,
    &kStepBatchSize,    &kStepTokens,        &kWorkerUp,         &kBuildInfo,
    &kRouterRequests,   &kRouterRoutes,      &kRouterRetries,    &kRouterReplicaUp,  &kRouterInFlight,
    &kRouterOutstandingTokens, &kRouterWaiting};

}  // namespace lazykv::metrics
