// The message of the dtrain::Error a call throws, for tests that check what an error names.
#pragma once

#include <functional>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::testing {

// "no error" when fn returns normally.
inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace dtrain::testing
