#include "kvstore/nvme_tier.h"

#include <cstdint>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "common/error.h"

namespace lazykv::kvstore {

namespace {

// Value layout: [magic u32][version u32][encoded key 32 B][checksum u64][bytes],
// integers little-endian. The embedded key catches a value stored under the
// wrong key; the checksum catches damaged bytes that RocksDB's own block
// checksums cannot see (a bad write path, a bug above RocksDB).
static_assert(std::endian::native == std::endian::little, "the value header is written in host order");
constexpr uint32_t kValueMagic = 0x4b56424c;  // "LBVK" in memory
constexpr uint32_t kValueVersion = 1;
constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 4;
constexpr size_t kKeyOffset = 8;
constexpr size_t kChecksumOffset = kKeyOffset + kEncodedBlockKeyBytes;
constexpr size_t kHeaderBytes = kChecksumOffset + 8;

std::array<uint8_t, kHeaderBytes> encode_header(const BlockKey& key, uint64_t checksum) {
  std::array<uint8_t, kHeaderBytes> header{};
  std::memcpy(header.data() + kMagicOffset, &kValueMagic, 4);
  std::memcpy(header.data() + kVersionOffset, &kValueVersion, 4);
  const auto encoded = encode_block_key(key);
  std::memcpy(header.data() + kKeyOffset, encoded.data(), encoded.size());
  std::memcpy(header.data() + kChecksumOffset, &checksum, 8);
  return header;
}

// What is wrong with a stored value, or "" if it is a block stored under
// `encoded_key` whose bytes match their checksum.
std::string value_problem(const rocksdb::Slice& value, const rocksdb::Slice& encoded_key) {
  if (value.size() < kHeaderBytes) {
    return "value of " + std::to_string(value.size()) + " bytes is shorter than its header";
  }
  uint32_t magic = 0, version = 0;
  uint64_t checksum = 0;
  std::memcpy(&magic, value.data() + kMagicOffset, 4);
  std::memcpy(&version, value.data() + kVersionOffset, 4);
  std::memcpy(&checksum, value.data() + kChecksumOffset, 8);
  if (magic != kValueMagic) return "bad magic";
  if (version != kValueVersion) return "unsupported value version " + std::to_string(version);
  if (encoded_key.size() != kEncodedBlockKeyBytes ||
      std::memcmp(value.data() + kKeyOffset, encoded_key.data(), kEncodedBlockKeyBytes) != 0) {
    return "stored key does not match";
  }
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(value.data()) + kHeaderBytes,
                                       value.size() - kHeaderBytes);
  if (block_checksum(bytes) != checksum) return "checksum mismatch";
  return "";
}

rocksdb::Slice as_slice(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

[[noreturn]] void throw_io(const std::string& what, const rocksdb::Status& status) {
  throw Error(ErrorCode::kIo, "nvme tier: " + what + ": " + status.ToString());
}

}  // namespace

struct NvmeTier::Impl {
  NvmeTierOptions options;
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::WriteOptions write_options;

  // The index mirrors the database (key -> block bytes) so that capacity,
  // block_bytes() and keys() need no RocksDB reads. Mutations of the
  // database and the index happen together under the mutex; reads of block
  // bytes go to RocksDB without it.
  mutable std::mutex mutex;
  std::map<BlockKey, uint64_t> index;
  uint64_t used_bytes = 0;

  void open();
  void recover();
  void erase_locked(const BlockKey& key);
};

void NvmeTier::Impl::open() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(options.path, ec) && !fs::is_directory(options.path, ec)) {
    throw Error(ErrorCode::kIo, "nvme tier: path '" + options.path + "' exists and is not a directory");
  }
  // RocksDB creates only the last component of the path.
  fs::create_directories(options.path, ec);
  if (ec) throw Error(ErrorCode::kIo, "nvme tier: cannot create '" + options.path + "': " + ec.message());
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.paranoid_checks = true;
  // KV activations compress poorly; compressing would cost CPU on every block.
  db_options.compression = rocksdb::kNoCompression;
  rocksdb::BlockBasedTableOptions table_options;
  table_options.checksum = rocksdb::kXXH3;
  db_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table_options));

  rocksdb::DB* raw = nullptr;
  const rocksdb::Status status = rocksdb::DB::Open(db_options, options.path, &raw);
  if (!status.ok()) throw_io("cannot open RocksDB at '" + options.path + "'", status);
  db.reset(raw);

  write_options.sync = options.sync_writes;
  write_options.disableWAL = false;  // the WAL is what makes an acknowledged put survive a crash
}

// Rebuilds the index from the database. Entries that cannot be blocks at
// all (a key of the wrong size, a value shorter than the header) are
// deleted; everything else is verified on get, like any other block.
void NvmeTier::Impl::recover() {
  rocksdb::ReadOptions read_options;
  read_options.fill_cache = false;
  rocksdb::WriteBatch malformed;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(read_options));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key();
    const uint64_t value_bytes = it->value().size();
    if (key.size() != kEncodedBlockKeyBytes || value_bytes < kHeaderBytes) {
      const rocksdb::Status status = malformed.Delete(key);
      if (!status.ok()) throw_io("cannot batch the delete of a malformed entry", status);
      continue;
    }
    const auto* key_bytes = reinterpret_cast<const uint8_t*>(key.data());
    index.emplace(decode_block_key({key_bytes, kEncodedBlockKeyBytes}), value_bytes - kHeaderBytes);
    used_bytes += value_bytes - kHeaderBytes;
  }
  if (!it->status().ok()) throw_io("cannot scan '" + options.path + "'", it->status());
  it.reset();
  if (malformed.Count() > 0) {
    const rocksdb::Status status = db->Write(write_options, &malformed);
    if (!status.ok()) throw_io("cannot delete malformed entries", status);
  }
}

void NvmeTier::Impl::erase_locked(const BlockKey& key) {
  const auto entry = index.find(key);
  if (entry == index.end()) return;
  const auto encoded = encode_block_key(key);
  const rocksdb::Status status = db->Delete(write_options, as_slice(encoded));
  if (!status.ok()) throw_io("cannot erase block " + key.to_string(), status);
  used_bytes -= entry->second;
  index.erase(entry);
}

NvmeTier::NvmeTier(NvmeTierOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->open();
  impl_->recover();
}

NvmeTier::~NvmeTier() {
  if (impl_ && impl_->db) impl_->db->Close().PermitUncheckedError();
}

void NvmeTier::put(const BlockKey& key, std::span<const uint8_t> bytes, uint64_t checksum) {
  // A block damaged in host memory must not be written as if it were whole.
  if (block_checksum(bytes) != checksum) {
    throw Error(ErrorCode::kInvalidArgument,
                "nvme tier: checksum of block " + key.to_string() + " does not match its bytes");
  }
  const auto encoded = encode_block_key(key);
  const auto header = encode_header(key, checksum);
  const rocksdb::Slice value_parts[] = {as_slice(header), as_slice(bytes)};
  const rocksdb::Slice key_slice = as_slice(encoded);

  std::lock_guard lock(impl_->mutex);
  const auto existing = impl_->index.find(key);
  const uint64_t replaced = existing == impl_->index.end() ? 0 : existing->second;
  const uint64_t new_used = impl_->used_bytes - replaced + bytes.size();
  if (new_used > impl_->options.capacity_bytes) {
    throw Error(ErrorCode::kOutOfMemory,
                "nvme tier: block " + key.to_string() + " of " + std::to_string(bytes.size()) +
                    " bytes does not fit (" + std::to_string(impl_->used_bytes) + " of " +
                    std::to_string(impl_->options.capacity_bytes) + " bytes used)");
  }
  rocksdb::WriteBatch batch;
  rocksdb::Status status = batch.Put(rocksdb::SliceParts(&key_slice, 1), rocksdb::SliceParts(value_parts, 2));
  if (status.ok()) status = impl_->db->Write(impl_->write_options, &batch);
  if (!status.ok()) throw_io("cannot write block " + key.to_string(), status);
  impl_->index[key] = bytes.size();
  impl_->used_bytes = new_used;
}

bool NvmeTier::get(const BlockKey& key, std::vector<uint8_t>& out) {
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->index.contains(key)) return false;
  }
  const auto encoded = encode_block_key(key);
  const rocksdb::Slice key_slice = as_slice(encoded);
  auto read = [&](rocksdb::PinnableSlice& value) {
    const rocksdb::Status status =
        impl_->db->Get(rocksdb::ReadOptions(), impl_->db->DefaultColumnFamily(), key_slice, &value);
    if (status.IsNotFound()) return std::string("missing");  // erased concurrently
    if (status.IsCorruption()) return "RocksDB reports corruption: " + status.ToString();
    if (!status.ok()) throw_io("cannot read block " + key.to_string(), status);
    return value_problem(value, key_slice);
  };

  rocksdb::PinnableSlice value;
  std::string problem = read(value);
  if (!problem.empty()) {
    // Re-check under the mutex: a concurrent put or erase may have replaced
    // what we read, and only a block that is still bad is erased.
    std::lock_guard lock(impl_->mutex);
    if (!impl_->index.contains(key)) return false;
    value.Reset();
    problem = read(value);
    if (!problem.empty()) {
      impl_->erase_locked(key);
      throw Error(ErrorCode::kIo, "nvme tier: corrupt block " + key.to_string() + " (" + problem + "); erased");
    }
  }
  out.assign(value.data() + kHeaderBytes, value.data() + value.size());
  return true;
}

std::optional<uint64_t> NvmeTier::block_bytes(const BlockKey& key) const {
  std::lock_guard lock(impl_->mutex);
  const auto entry = impl_->index.find(key);
  if (entry == impl_->index.end()) return std::nullopt;
  return entry->second;
}

bool NvmeTier::erase(const BlockKey& key) {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->index.contains(key)) return false;
  impl_->erase_locked(key);
  return true;
}

size_t NvmeTier::erase_sequence(uint64_t model_fingerprint, uint64_t sequence) {
  return erase_range(model_fingerprint, sequence, SIZE_MAX);
}

size_t NvmeTier::erase_model(uint64_t model_fingerprint, size_t limit) {
  return erase_range(model_fingerprint, std::nullopt, limit);
}

size_t NvmeTier::erase_range(uint64_t model_fingerprint, std::optional<uint64_t> sequence, size_t limit) {
  // The index holds exactly the database's blocks, so one batch of point
  // deletes covers the key range (and keeps the accounting exact, which a
  // DeleteRange over unknown keys would not).
  const BlockKey first{.model_fingerprint = model_fingerprint, .sequence = sequence.value_or(0)};
  const std::string what = sequence ? "sequence " + std::to_string(*sequence)
                                    : "the blocks of model fingerprint " + std::to_string(model_fingerprint);
  std::lock_guard lock(impl_->mutex);
  auto begin = impl_->index.lower_bound(first);
  auto end = begin;
  rocksdb::WriteBatch batch;
  uint64_t freed = 0;
  size_t count = 0;
  for (; count < limit && end != impl_->index.end() && end->first.model_fingerprint == model_fingerprint &&
         (!sequence || end->first.sequence == *sequence);
       ++end) {
    const auto encoded = encode_block_key(end->first);
    const rocksdb::Status status = batch.Delete(as_slice(encoded));
    if (!status.ok()) throw_io("cannot batch the erase of " + what, status);
    freed += end->second;
    ++count;
  }
  if (count == 0) return 0;
  const rocksdb::Status status = impl_->db->Write(impl_->write_options, &batch);
  if (!status.ok()) throw_io("cannot erase " + what, status);
  impl_->index.erase(begin, end);
  impl_->used_bytes -= freed;
  return count;
}

std::vector<BlockKey> NvmeTier::keys() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<BlockKey> keys;
  keys.reserve(impl_->index.size());
  for (const auto& [key, bytes] : impl_->index) keys.push_back(key);
  return keys;
}

NvmeTierStats NvmeTier::stats() const {
  std::lock_guard lock(impl_->mutex);
  return {.capacity_bytes = impl_->options.capacity_bytes,
          .used_bytes = impl_->used_bytes,
          .blocks = impl_->index.size()};
}

}  // namespace lazykv::kvstore
