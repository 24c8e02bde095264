// worker/step_executor.h <-> lazykv.worker.v1 messages, both directions, for
// both ends of the wire (the worker service and the coordinator's
// RemoteWorker): one codec, so the two sides cannot drift apart.
#pragma once

#include "lazykv/worker/v1/worker.pb.h"
#include "worker/step_executor.h"

namespace lazykv::rpc {

namespace pb = ::lazykv::worker::v1;

void to_proto(const PolicyConfig& in, pb::PolicyConfig* out);
void to_proto(const SamplingParams& in, pb::SamplingParams* out);
void to_proto(const SequenceStart& in, pb::SequenceStart* out);
void to_proto(const StepItem& in, pb::StepItem* out);
void to_proto(const StepPlan& in, pb::StepPlan* out);
void to_proto(const SampledToken& in, pb::SampledToken* out);
void to_proto(const StepResult& in, pb::StepResult* out);
void to_proto(const WorkerInfo& in, pb::WorkerInfo* out);

// Decoding copies fields as they are; the policy is not validated here (the
// worker service checks it per sequence, see validate_policy).
PolicyConfig from_proto(const pb::PolicyConfig& in);
SamplingParams from_proto(const pb::SamplingParams& in);
SequenceStart from_proto(const pb::SequenceStart& in);
StepItem from_proto(const pb::StepItem& in);
StepPlan from_proto(const pb::StepPlan& in);
SampledToken from_proto(const pb::SampledToken& in);
StepResult from_proto(const pb::StepResult& in);
WorkerInfo from_proto(const pb::WorkerInfo& in);

// The policy rebuilt through make_policy_config (names, ranges, cross-parameter
// rules), so a malformed plan fails one sequence with a clear message instead
// of reaching a policy with values it never accepts. Throws Error(kInvalidArgument).
PolicyConfig validate_policy(const PolicyConfig& config);

}  // namespace lazykv::rpc
