// What the API services (HTTP and gRPC) share: the served model, API keys and
// their concurrency limit, request limits and defaults.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/policy_config.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/chat/reasoning_splitter.h"
#include "coordinator/grammar/constraint_cache.h"

namespace lazykv {

// Requests in flight per API key, shared by every service of a server so the
// limit holds across HTTP and gRPC.
class KeyLimiter {
 public:
  explicit KeyLimiter(int limit) : limit_(limit) {}
  int limit() const { return limit_; }
  // Takes a slot of `key` for the holder's lifetime; empty when the key is at its limit.
  class Slot {
   public:
    Slot() = default;
    Slot(KeyLimiter* owner, std::string key) : owner_(owner), key_(std::move(key)) {}
    Slot(Slot&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), key_(std::move(o.key_)) {}
    Slot& operator=(Slot&& o) noexcept {
      release();
      owner_ = std::exchange(o.owner_, nullptr);
      key_ = std::move(o.key_);
      return *this;
    }
    ~Slot() { release(); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    void release() {
      if (owner_ != nullptr) owner_->release(key_);
      owner_ = nullptr;
    }
    KeyLimiter* owner_ = nullptr;
    std::string key_;
  };
  // Throws api::ApiError(429) when the key already has `limit` requests in flight (limit 0: never).
  Slot acquire(const std::string& key);

 private:
  void release(const std::string& key);
  int limit_;
  std::mutex mutex_;
  std::map<std::string, int> in_flight_;
};

struct ServiceConfig {
  std::string model_id;                  // the name clients pass as "model"
  std::vector<std::string> api_keys;     // empty: no authentication
  // Requests in flight per API key (without keys: all requests together); null or limit 0: unlimited.
  std::shared_ptr<KeyLimiter> key_limiter;
  api::RequestLimits limits;
  PolicyConfig default_policy = make_policy_config("full");  // when a request names no kv_policy
  int32_t completions_default_max_tokens = 16;  // OpenAI's default for /v1/completions
  // How chat replies split into reasoning_content and content; nullopt
  // ("auto"): <think> blocks when the chat template mentions <think>.
  std::optional<ReasoningFormat> reasoning;
  std::string version;
  // Structured outputs' compiled constraints, shared by the services of a
  // server; null: each service keeps its own.
  std::shared_ptr<grammar::ConstraintCache> constraints;

  // True when keys are off or `key` is one of them (compared in constant time).
  bool accepts_key(std::string_view key) const;
  // The accepted key of an "Authorization: Bearer <key>" value ("" when keys
  // are off), or nullopt. The scheme is case-insensitive (RFC 7235).
  std::optional<std::string> key_of_authorization(std::string_view header) const;
  // Throws api::ApiError(404, code model_not_found) unless `model` is model_id.
  void check_model(const std::string& model) const;
};

}  // namespace lazykv
