// Small helpers shared by tests: running a built executable, catching an Error's message, a
// per-test scratch directory, reading files, comparing logits.
#pragma once

#include "core/error.h"
#include "support/test_paths.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace swiftlet::testing {

struct CmdResult {
  int status;       // exit status, -1 if it did not exit normally
  std::string out;  // stdout, and stderr too unless stdout_only
};

// Runs a shell command line; its stdout (and whatever the line redirects there) and exit status.
inline CmdResult run_command(const std::string& cmd) {
  CmdResult r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Runs build/bin/EXE ARGS through the shell.
inline CmdResult run_binary(const std::string& exe, const std::string& args, bool stdout_only = false) {
  return run_command(bin_path(exe) + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1"));
}

// The message of the swiftlet::Error that f() throws, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A scratch directory for the running test: $TMPDIR/swiftlet_<suite>_<pid>_<test>, empty when made
// and removed with all it holds when the object goes.
class ScratchDir {
 public:
  ScratchDir() {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("swiftlet_" + file_safe(t ? t->test_suite_name() : "test") + "_" + std::to_string(::getpid()) + "_" +
             file_safe(t ? t->name() : "none"));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  // Parameterised tests' names hold '/': anything but letters and digits becomes '_'.
  static std::string file_safe(std::string s) {
    for (char& c : s)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
  }
  std::filesystem::path path_;
};

// A file's bytes as a string (empty if it cannot be read: the comparison that follows fails).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A file of float32 values in the machine's byte order (the fixtures' logits and hidden states).
inline std::vector<float> read_f32(const std::string& path) {
  const std::string b = read_file(path);
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

// The largest |a[i] - b[i]|; different sizes are a test failure.
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Token ids as command-line text: "5,17,42".
inline std::string join_ids(const std::vector<int32_t>& ids, const char* sep = ",") {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace swiftlet::testing
