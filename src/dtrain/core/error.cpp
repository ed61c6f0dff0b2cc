// Out-of-line part of the check macros.
#include "dtrain/core/error.h"

namespace dtrain::detail {

void throw_check_failure(const char* file, int line, const std::string& message) {
  throw InternalError(concat(file, ":", line, ": ", message));
}

}  // namespace dtrain::detail
