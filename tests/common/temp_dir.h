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

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterized test's name holds a '/' ("Case/Param"): made part of one folder's
    // name, not a folder within another, so that TearDown removes all of it.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = std::filesystem::temp_directory_path() / ("dtrain_" + std::to_string(::getpid()) + "_" + name);
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
