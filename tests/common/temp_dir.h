// A fresh directory per test, removed afterwards: files a test writes never collide with
// another test's or another run's.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

namespace dtrain::testing {

// A path in the temporary directory that names this process, so that runs at once do
// not collide: /tmp/dtrain_<pid>_<name>.
inline std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("dtrain_" + std::to_string(::getpid()) + "_" + name);
}

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterized test's name holds a '/' ("Case/Param"): made part of one folder's
    // name, not a folder within another, so that TearDown removes all of it.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = temp_path(name);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `bytes` to a file in the directory and returns its path.
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::filesystem::path dir_;
};

}  // namespace dtrain::testing
