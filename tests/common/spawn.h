// A task program started as a child process by the multi-process tests: its standard
// output and error go to `log`, `env` is set on top of the test's environment.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

namespace dtrain::testing {

inline pid_t spawn(std::vector<std::string> argv, const std::vector<std::pair<std::string, std::string>>& env,
                   const std::string& log) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 1);
  dup2(fd, 2);
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

}  // namespace dtrain::testing
