// The dtrain command run as a child process by the CLI tests (DTRAIN_BINARY is set by
// tests/CMakeLists.txt), and the big-endian words IDX files are made of.
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace dtrain::testing {

struct CliResult {
  int code;            // the exit code; -1 when a signal ended the command
  std::string output;  // stdout and stderr together
  int signal = 0;      // the signal that ended the command (SIGKILL, ...); 0 when it exited
};

// `env`: VAR=value words put before the command. TF_CONFIG is unset first, so the
// environment the tests run in cannot make the command join a cluster. `timeout_seconds`
// > 0: timeout(1) sends the command SIGTERM after that long (SIGKILL 10 s later) and the
// code is 124, so that a command that hangs still ends. The shell execs the command, so a
// signal that ends it is the result's.
inline CliResult run_cli(const std::string& args, const std::string& env = "", int timeout_seconds = 0) {
  const std::string limit = timeout_seconds > 0 ? " timeout -k 10 " + std::to_string(timeout_seconds) : "";
  const std::string cmd =
      "exec env -u TF_CONFIG " + env + limit + " " + std::string(DTRAIN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, WIFSIGNALED(status) ? WTERMSIG(status) : 0};
}

// A small config the command-line tests train in a second: a 2-layer MLP on 600
// synthetic rows of 8 features, 3 classes, 3 epochs of batches of 32; `extra` adds keys.
inline std::string tiny_config_json(const std::string& extra = "") {
  return R"({
      "model": {"input_shape": [8], "layers": [
        {"class_name": "Dense", "config": {"units": 16, "activation": "relu"}},
        {"class_name": "Dense", "config": {"units": 3}}]},
      "loss": {"name": "sparse_categorical_crossentropy", "from_logits": true},
      "optimizer": {"name": "adam", "learning_rate": 0.01},
      "metrics": ["accuracy"],
      "data": {"source": "synthetic", "samples": 600, "test_samples": 200, "features": 8, "classes": 3, "labels": "teacher"},
      "epochs": 3, "batch_size": 32, "seed": 4)" + extra + "}";
}

inline std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

}  // namespace dtrain::testing
