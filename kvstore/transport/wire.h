// The transport's own header, sent in front of the user header in every
// active message. Both ends run the same code on the same kind of host, so
// it travels in host byte order; the magic/version reject anything else.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

namespace lazykv::transport::wire {

// Active message ids.
inline constexpr unsigned kAmRequest = 0x4c4b;  // client -> server
inline constexpr unsigned kAmReply = 0x4c4c;    // server -> client

inline constexpr uint32_t kMagic = 0x4c4b5654;  // "LKVT"
inline constexpr uint16_t kVersion = 2;  // 2: hellos carry the host

enum class Kind : uint16_t {
  kCall = 1,   // a request (op) or its reply (status)
  kHello = 2,  // connection check; request and reply carry a HostHello
};

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  Kind kind = Kind::kCall;
  uint64_t request_id = 0;
  uint32_t code = 0;  // op in a request, status in a reply
  uint32_t user_header_bytes = 0;
  uint64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == 32);

// Wire header + user header, ready to send.
inline std::vector<uint8_t> encode(const Header& header, std::span<const uint8_t> user_header) {
  std::vector<uint8_t> out(sizeof(Header) + user_header.size());
  Header h = header;
  h.user_header_bytes = static_cast<uint32_t>(user_header.size());
  std::memcpy(out.data(), &h, sizeof(h));
  if (!user_header.empty()) std::memcpy(out.data() + sizeof(h), user_header.data(), user_header.size());
  return out;
}

struct Decoded {
  Header header;
  std::span<const uint8_t> user_header;
};

// Nullopt for anything that is not a well-formed message of this version.
inline std::optional<Decoded> decode(const void* data, size_t bytes) {
  if (data == nullptr || bytes < sizeof(Header)) return std::nullopt;
  Decoded out;
  std::memcpy(&out.header, data, sizeof(Header));
  if (out.header.magic != kMagic || out.header.version != kVersion) return std::nullopt;
  if (out.header.user_header_bytes != bytes - sizeof(Header)) return std::nullopt;
  out.user_header = {static_cast<const uint8_t*>(data) + sizeof(Header), out.header.user_header_bytes};
  return out;
}

// The user header of a hello and of its reply: which host the sender runs
// on, so each side knows whether shared memory could have reached the other
// (ending on tcp is then a fallback worth a warning, not the expected case).
//
// A hello must stay tiny: it is the first message on a new endpoint, sent
// while UCX 1.13 still rewires the endpoint from its connection-manager lanes
// (tcp, eager short up to ~8 KiB) to its final ones (shm: eager short up to
// ~90 bytes). UCX replays such a queued send with the protocol it chose
// before the switch, and a "short" message longer than the shm limit then
// fails (Invalid am_short_iov length). Later messages see the final lanes.
struct HostHello {
  uint64_t host = 0;  // host_identity_hash() of the sender
};
inline constexpr size_t kMaxHelloBytes = 64;  // below every shm transport's eager-short limit
static_assert(sizeof(Header) + sizeof(HostHello) <= kMaxHelloBytes);

inline std::vector<uint8_t> encode_hello(const HostHello& hello) {
  std::vector<uint8_t> out(sizeof(hello.host));
  std::memcpy(out.data(), &hello.host, sizeof(hello.host));
  return out;
}

// Nullopt unless `bytes` is exactly one encoded HostHello.
inline std::optional<HostHello> decode_hello(std::span<const uint8_t> bytes) {
  HostHello out;
  if (bytes.size() != sizeof(out.host)) return std::nullopt;
  std::memcpy(&out.host, bytes.data(), sizeof(out.host));
  return out;
}

}  // namespace lazykv::transport::wire
