#include "kvstore/block.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>

#include <xxhash.h>

#include "common/error.h"

namespace lazykv::kvstore {

namespace {

// Big-endian so that comparing encodings byte by byte (RocksDB's default
// comparator) orders them like the fields compared in declaration order.
template <typename T>
void put_big_endian(uint8_t* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<uint8_t>(value >> (8 * (sizeof(T) - 1 - i)));
  }
}

template <typename T>
T get_big_endian(const uint8_t* in) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value = static_cast<T>((value << 8) | in[i]);
  return value;
}

}  // namespace

std::string BlockKey::to_string() const {
  // The fingerprint is a hash: hex reads better and matches how logs show it.
  char fingerprint[19];
  std::snprintf(fingerprint, sizeof(fingerprint), "%016llx",
                static_cast<unsigned long long>(model_fingerprint));
  return std::string("fp=") + fingerprint + " seq=" + std::to_string(sequence) +
         " layer=" + std::to_string(layer) + " head=" + std::to_string(kv_head) +
         " pos=" + std::to_string(first_position) + "+" + std::to_string(count);
}

std::array<uint8_t, kEncodedBlockKeyBytes> encode_block_key(const BlockKey& key) {
  std::array<uint8_t, kEncodedBlockKeyBytes> out{};
  put_big_endian(out.data() + 0, key.model_fingerprint);
  put_big_endian(out.data() + 8, key.sequence);
  put_big_endian(out.data() + 16, key.layer);
  put_big_endian(out.data() + 20, key.kv_head);
  put_big_endian(out.data() + 24, key.first_position);
  put_big_endian(out.data() + 28, key.count);
  return out;
}

std::array<uint8_t, kSequencePrefixBytes> encode_sequence_prefix(uint64_t model_fingerprint,
                                                                 uint64_t sequence) {
  std::array<uint8_t, kSequencePrefixBytes> out{};
  put_big_endian(out.data() + 0, model_fingerprint);
  put_big_endian(out.data() + 8, sequence);
  return out;
}

BlockKey decode_block_key(std::span<const uint8_t> bytes) {
  if (bytes.size() != kEncodedBlockKeyBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "encoded block key has " + std::to_string(bytes.size()) + " bytes, expected " +
                    std::to_string(kEncodedBlockKeyBytes));
  }
  BlockKey key;
  key.model_fingerprint = get_big_endian<uint64_t>(bytes.data() + 0);
  key.sequence = get_big_endian<uint64_t>(bytes.data() + 8);
  key.layer = get_big_endian<uint32_t>(bytes.data() + 16);
  key.kv_head = get_big_endian<uint32_t>(bytes.data() + 20);
  key.first_position = get_big_endian<uint32_t>(bytes.data() + 24);
  key.count = get_big_endian<uint32_t>(bytes.data() + 28);
  return key;
}

size_t BlockKeyHash::operator()(const BlockKey& key) const {
  // Hashing the encoding mixes every field; keys are small so this is cheap.
  const auto encoded = encode_block_key(key);
  return static_cast<size_t>(XXH3_64bits(encoded.data(), encoded.size()));
}

uint64_t block_checksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::vector<uint8_t> gather_block_rows(const BlockKey& key, std::span<const uint8_t> block, uint64_t checksum,
                                       const RowSelection& selection) {
  const size_t row_bytes = selection.row_bytes;
  const auto& rows = selection.rows;
  const bool ascending = std::adjacent_find(rows.begin(), rows.end(), std::greater_equal<>()) == rows.end();
  if (rows.empty() || row_bytes == 0 || !ascending || rows.back() >= key.count ||
      block.size() != 2 * size_t(key.count) * row_bytes) {
    throw Error(ErrorCode::kInvalidArgument, "a row get of " + std::to_string(rows.size()) + " rows of " +
                                                 std::to_string(row_bytes) + " bytes does not fit block " +
                                                 key.to_string() + " (" + std::to_string(block.size()) + " bytes)");
  }
  if (block_checksum(block) != checksum) {
    throw Error(ErrorCode::kIo, "block " + key.to_string() + " no longer matches its checksum");
  }
  std::vector<uint8_t> out(selection.bytes());
  const uint8_t* v_rows = block.data() + size_t(key.count) * row_bytes;
  uint8_t* v_out = out.data() + rows.size() * row_bytes;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out.data() + i * row_bytes, block.data() + rows[i] * row_bytes, row_bytes);
    std::memcpy(v_out + i * row_bytes, v_rows + rows[i] * row_bytes, row_bytes);
  }
  return out;
}

size_t copy_block_bytes(const BlockKey& key, std::span<const uint8_t> bytes, std::span<uint8_t> out) {
  if (bytes.size() > out.size()) {
    throw Error(ErrorCode::kInvalidArgument, "block " + key.to_string() + ": " + std::to_string(bytes.size()) +
                                                 " bytes to read, the buffer has " + std::to_string(out.size()));
  }
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return bytes.size();
}

}  // namespace lazykv::kvstore
