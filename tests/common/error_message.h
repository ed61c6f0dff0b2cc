// The message of the dtrain::Error a call throws, for tests that check what an error names.
#pragma once

#include <functional>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::testing {

// "no error" when fn returns normally. An error of another kind than E is not caught, so
// the test fails on it: message_of<IoError>(...) also checks the kind.
template <typename E = Error>
std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace dtrain::testing
