// Out-of-line part of the check macros.
#include "dtrain/core/error.h"

#include <new>

namespace dtrain {

void rethrow_with_context(const std::exception_ptr& error, const std::string& context) {
  const std::string head = context + ": ";
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(head + e.what());
  } catch (const IoError& e) {
    throw IoError(head + e.what());
  } catch (const Timeout& e) {
    throw Timeout(head + e.what());
  } catch (const PeerFailure& e) {
    throw PeerFailure(head + e.what());
  } catch (const InternalError& e) {
    throw InternalError(head + e.what());
  } catch (const Preempted& e) {
    throw Preempted(head + e.what());
  } catch (const NotCapturable& e) {
    throw NotCapturable(head + e.what());
  } catch (const Unsupported& e) {
    throw Unsupported(head + e.what());
  } catch (const Unavailable& e) {
    throw Unavailable(head + e.what());
  } catch (const Cancelled& e) {
    throw Cancelled(head + e.what());
  } catch (const DeviceError& e) {
    throw DeviceError(head + e.what());
  } catch (const ResourceExhausted& e) {
    throw ResourceExhausted(head + e.what());
  } catch (const std::bad_alloc&) {
    throw ResourceExhausted(head + "out of memory");
  } catch (const std::exception& e) {
    throw Error(head + e.what());
  } catch (...) {
    throw Error(head + "an exception that is not a std::exception");
  }
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace dtrain

namespace dtrain::detail {

void throw_check_failure(const char* file, int line, const std::string& message) {
  throw InternalError(concat(file, ":", line, ": ", message));
}

}  // namespace dtrain::detail
