// dtrain's error policy: a small hierarchy a caller can catch by kind, plus check
// macros for broken invariants that print file, line and both values.
// Library code never aborts; see docs/errors.md for what a caller should do after each kind.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace dtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The caller passed something wrong: shapes, dtypes, names, values out of range.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file or stream could not be read or written, or held malformed data.
class IoError : public Error {
 public:
  using Error::Error;
};

// A bounded wait ran out: the message names the operation and who was waited for.
class Timeout : public Error {
 public:
  using Error::Error;
};

// A peer process or thread failed; the message names it.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

// A task of the cluster cannot be reached (a parameter server that died): the message
// names it (TensorFlow's UnavailableError).
class Unavailable : public Error {
 public:
  using Error::Error;
};

// The work was cancelled before it ran, because an earlier error stopped the queue it was
// in (TensorFlow's CancelledError).
class Cancelled : public Error {
 public:
  using Error::Error;
};

// Memory ran out, or a tensor asked for more than memory can hold: the message names the
// bytes (TensorFlow's ResourceExhaustedError).
class ResourceExhausted : public Error {
 public:
  using Error::Error;
};

// An internal invariant did not hold: a bug in dtrain, reported instead of aborting.
class InternalError : public Error {
 public:
  using Error::Error;
};

// A device (a GPU) failed: the message names the call, the operation and its sizes, and
// the device. After some failures (an illegal address in a kernel) the device can run
// nothing more in this process; the message says so.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// The backend cannot run this operation with these arguments (dtype, device).
class Unsupported : public Error {
 public:
  using Error::Error;
};

// Work that cannot be recorded into a CUDA graph was asked for while a step was being
// captured: a wait for the device, a copy between the host and the device, random numbers
// drawn on the host. The message names the call; fit then runs its steps one kernel at a
// time and says why.
class NotCapturable : public Unsupported {
 public:
  using Unsupported::Unsupported;
};

// Training stopped because the process was asked to (SIGTERM, a cloud's preemption
// notice) after saving a checkpoint it resumes from; the dtrain command exits with
// kPreemptedExitCode (75, EX_TEMPFAIL: "try again") and `dtrain launch` restarts the job.
class Preempted : public Error {
 public:
  using Error::Error;
};
inline constexpr int kPreemptedExitCode = 75;

// Rethrows `error` as the same kind of dtrain error with "context: " before its message
// (other exceptions become Error), so a caller can still catch it by kind.
[[noreturn]] void rethrow_with_context(const std::exception_ptr& error, const std::string& context);
// The message of an exception held in `error`.
std::string message_of(const std::exception_ptr& error);

namespace detail {

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

[[noreturn]] void throw_check_failure(const char* file, int line, const std::string& message);

}  // namespace detail

// Builds a message from parts streamed together: DTRAIN_THROW(InvalidArgument, "x=", x).
#define DTRAIN_THROW(Kind, ...) throw Kind(::dtrain::detail::concat(__VA_ARGS__))

// Invariant checks: always on (they guard library state, not hot inner loops).
#define DTRAIN_CHECK(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::dtrain::detail::throw_check_failure(                                             \
          __FILE__, __LINE__, ::dtrain::detail::concat("check failed: " #cond " ", ##__VA_ARGS__)); \
  } while (0)

#define DTRAIN_CHECK_OP(a, op, b, ...)                                                   \
  do {                                                                                   \
    const auto& dtrain_a_ = (a);                                                         \
    const auto& dtrain_b_ = (b);                                                         \
    if (!(dtrain_a_ op dtrain_b_))                                                       \
      ::dtrain::detail::throw_check_failure(                                             \
          __FILE__, __LINE__,                                                            \
          ::dtrain::detail::concat("check failed: " #a " " #op " " #b " (", dtrain_a_,   \
                                   " vs ", dtrain_b_, ") ", ##__VA_ARGS__));             \
  } while (0)

#define DTRAIN_CHECK_EQ(a, b, ...) DTRAIN_CHECK_OP(a, ==, b, ##__VA_ARGS__)
#define DTRAIN_CHECK_LE(a, b, ...) DTRAIN_CHECK_OP(a, <=, b, ##__VA_ARGS__)
#define DTRAIN_CHECK_LT(a, b, ...) DTRAIN_CHECK_OP(a, <, b, ##__VA_ARGS__)

}  // namespace dtrain
