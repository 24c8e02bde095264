#include "kvstore/client/kvstore_client.h"

#include <grpcpp/grpcpp.h>

#include "common/error.h"
#include "common/host_port.h"
#include "kvstore/protocol/data_protocol.h"

namespace lazykv::kvstore {
namespace {

namespace pb = ::lazykv::kvstore::v1;

std::chrono::system_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

}  // namespace

std::string data_host_for(const std::string& control_address, const std::string& advertised) {
  if (!is_wildcard_host(advertised)) return advertised;
  std::string host;
  try {
    host = parse_host_port(control_address, "kvstore address").first;
  } catch (const Error&) {
    return advertised;  // a gRPC target, not HOST:PORT: the wildcard, as before (works on this host)
  }
  if (host.find('/') != std::string::npos) return advertised;  // "dns:///name:port" and the like
  if (advertised == "::") return host;
  // 0.0.0.0 listens on IPv4 only, while a name may resolve to IPv6 first.
  const std::string v4 = ipv4_address_of(host);
  return v4.empty() ? host : v4;
}

KvstoreClient::KvstoreClient(KvstoreClientOptions options) : options_(std::move(options)) {
  channel_ = grpc::CreateChannel(options_.address, grpc::InsecureChannelCredentials());
  stub_ = pb::Kvstore::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(deadline_after(options_.timeout));
  const grpc::Status status = stub_->Info(&context, pb::InfoRequest(), &info_);
  if (!status.ok()) {
    throw Error(ErrorCode::kUnavailable,
                "kvstore at " + options_.address + " does not answer: " + status.error_message());
  }
  data_ = std::make_unique<transport::Client>(options_.transport, data_host_for(options_.address, info_.data_host()),
                                              uint16_t(info_.data_port()));
}

KvstoreClient::~KvstoreClient() = default;

transport::Reply KvstoreClient::call(uint32_t op, const std::vector<uint8_t>& header,
                                     std::span<const uint8_t> payload, std::span<uint8_t> reply_buffer,
                                     const char* what) {
  size_t offered = 0;
  transport::Reply reply = data_->call(
      op, header, payload,
      [&](std::span<const uint8_t>, size_t bytes) -> std::span<uint8_t> {
        offered = bytes;
        if (bytes > reply_buffer.size()) return {};
        return reply_buffer.first(bytes);
      },
      options_.timeout);
  if (reply.status != transport::kStatusOk) {
    pb::ReplyHeader header_reply;
    std::string message = status_name(reply.status);
    if (header_reply.ParseFromArray(reply.header.data(), int(reply.header.size())) &&
        !header_reply.message().empty()) {
      message += ": " + header_reply.message();
    }
    if (reply.status == transport::kStatusPayloadRefused) message += " (no room in the host tier, or a bad header)";
    throw Error(error_code_for(reply.status), std::string("kvstore ") + what + " failed: " + message);
  }
  if (offered > reply_buffer.size()) {
    throw Error(ErrorCode::kInvalidArgument, std::string("kvstore ") + what + ": the block has " +
                                                 std::to_string(offered) + " bytes, the buffer " +
                                                 std::to_string(reply_buffer.size()));
  }
  return reply;
}

void KvstoreClient::put(const BlockKey& key, std::span<const uint8_t> bytes, BlockHint hint) {
  pb::PutHeader header;
  to_proto(key, header.mutable_key());
  header.set_checksum(block_checksum(bytes));
  header.set_steps_until_use(hint.steps_until_use);
  header.set_shared(hint.shared);
  call(kOpPut, serialize(header), bytes, {}, "put");
}

size_t KvstoreClient::get(const BlockKey& key, std::span<uint8_t> out, BlockHint hint) {
  pb::GetHeader header;
  to_proto(key, header.mutable_key());
  header.set_steps_until_use(hint.steps_until_use);
  return read(key, header, out);
}

size_t KvstoreClient::get_rows(const BlockKey& key, const RowSelection& selection, std::span<uint8_t> out,
                               BlockHint hint) {
  if (selection.rows.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "a row get of block " + key.to_string() + " names no row");
  }
  if (!info_.row_gets()) {
    // A kvstore older than row gets would send the whole block: ask for it
    // and gather here (the same bytes, more of them on the wire).
    std::vector<uint8_t> block(2 * size_t(key.count) * selection.row_bytes);
    block.resize(get(key, block, hint));
    return copy_block_bytes(key, gather_block_rows(key, block, block_checksum(block), selection), out);
  }
  pb::GetHeader header;
  to_proto(key, header.mutable_key());
  header.set_steps_until_use(hint.steps_until_use);
  header.mutable_rows()->Add(selection.rows.begin(), selection.rows.end());
  header.set_row_bytes(selection.row_bytes);
  return read(key, header, out);
}

size_t KvstoreClient::read(const BlockKey& key, const pb::GetHeader& header, std::span<uint8_t> out) {
  const transport::Reply reply = call(kOpGet, serialize(header), {}, out, "get");
  pb::ReplyHeader answer;
  parse(reply.header, &answer, "get reply");
  const BlockKey served = from_proto(answer.key());
  if (served != key) {
    throw Error(ErrorCode::kIo, "kvstore served block " + served.to_string() + " for " + key.to_string());
  }
  const std::span<const uint8_t> bytes = out.first(reply.payload_bytes);
  if (block_checksum(bytes) != answer.checksum()) {
    throw Error(ErrorCode::kIo, "kvstore block " + key.to_string() + " arrived with a wrong checksum");
  }
  return reply.payload_bytes;
}

bool KvstoreClient::drop(const BlockKey& key) {
  pb::DropHeader header;
  to_proto(key, header.mutable_key());
  const transport::Reply reply = call(kOpDrop, serialize(header), {}, {}, "drop");
  pb::ReplyHeader answer;
  parse(reply.header, &answer, "drop reply");
  return answer.count() > 0;
}

size_t KvstoreClient::drop_sequence(uint64_t model_fingerprint, uint64_t sequence) {
  pb::DropSequenceHeader header;
  header.set_model_fingerprint(model_fingerprint);
  header.set_sequence(sequence);
  const transport::Reply reply = call(kOpDropSequence, serialize(header), {}, {}, "drop_sequence");
  pb::ReplyHeader answer;
  parse(reply.header, &answer, "drop_sequence reply");
  return size_t(answer.count());
}

::lazykv::kvstore::v1::StatsReply KvstoreClient::fetch_stats() {
  grpc::ClientContext context;
  context.set_deadline(deadline_after(options_.timeout));
  pb::StatsReply reply;
  const grpc::Status status = stub_->Stats(&context, pb::StatsRequest(), &reply);
  if (!status.ok()) throw Error(ErrorCode::kUnavailable, "kvstore stats: " + status.error_message());
  return reply;
}

TierStoreStats KvstoreClient::stats() { return from_proto(fetch_stats()); }
uint64_t KvstoreClient::peers() { return fetch_stats().peers(); }
void KvstoreClient::register_memory(std::span<uint8_t> memory) { data_->register_memory(memory); }
bool KvstoreClient::connected() const { return data_->connected(); }
std::string KvstoreClient::transport() const { return data_->transport(); }
std::string KvstoreClient::describe() const { return "kvstore " + options_.address + " via " + transport(); }

}  // namespace lazykv::kvstore
