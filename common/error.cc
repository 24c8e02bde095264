#include "common/error.h"

namespace lazykv {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kInvalidModel: return "invalid_model";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kOutOfMemory: return "out_of_memory";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace lazykv
