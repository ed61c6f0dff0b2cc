// Runs one body per rank, each on a thread of its own, as the ranks of a collective do in
// the comm tests: a rank's exception is recorded (its message, per rank), not rethrown.
#pragma once

#include <exception>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::testing {

// "worker:0" ... "worker:<size - 1>", the task names the comm tests give their ranks.
inline std::vector<std::string> task_names(int size) {
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.push_back("worker:" + std::to_string(r));
  return out;
}

template <typename Body>
std::vector<std::string> on_ranks(int size, Body body) {
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace dtrain::testing
