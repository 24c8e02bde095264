// Byte-pair merging of one pre-tokenized piece: start from one symbol per
// byte-level character and repeatedly merge the adjacent pair with the lowest
// merge rank (leftmost first on ties), as Hugging Face's BPE model does.
// A min-heap over candidate pairs with a linked list of symbols makes this
// O(n log n) per piece.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace lazykv {

struct TransparentStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
using TokenIdMap = std::unordered_map<std::string, int32_t, TransparentStringHash, std::equal_to<>>;

class BpeMerger {
 public:
  // merges: "left right" in priority order; pairs whose parts or result are
  // not tokens are skipped.
  BpeMerger(const TokenIdMap& token_ids, const std::vector<std::string>& merges, int32_t unk_id);

  // Reused buffers, one per calling thread (encode creates its own).
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev;
      int32_t next;
      bool alive;
    };
    struct Candidate {
      int32_t rank;
      int32_t pos;  // the left symbol
      int32_t left_id;
      int32_t right_id;
      int32_t merged_id;
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : pos > other.pos;
      }
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the token ids of one piece of raw bytes to out.
  void merge(std::string_view piece, Scratch& scratch, std::vector<int32_t>& out) const;

 private:
  struct MergeResult {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  void push_candidate(Scratch& scratch, int32_t pos) const;

  std::unordered_map<uint64_t, MergeResult> merges_;
  std::array<int32_t, 256> byte_token_{};  // token of each single byte-level character, or -1
  int32_t unk_id_;
};

}  // namespace lazykv
