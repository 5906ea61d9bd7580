// Stand-in for the part of GoogleTest that cuda_kernels_test.cpp uses, for the standalone CUDA
// test build on machines without libgtest-dev (build.sh). Prints gtest-like lines; exit status
// 1 when a test failed. --gtest_filter is ignored.
#pragma once

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace shim {

struct TestCase {
  const char* suite;
  const char* name;
  void (*fn)();
};
inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> r;
  return r;
}
struct Registrar {
  Registrar(const char* s, const char* n, void (*fn)()) { registry().push_back({s, n, fn}); }
};
struct State {
  bool failed = false, skipped = false;
};
inline State& state() {
  static State s;
  return s;
}

struct Message {
  std::ostringstream os;
  template <typename T>
  Message& operator<<(const T& v) {
    os << v;
    return *this;
  }
};

struct Reporter {
  const char* file;
  int line;
  std::string what;
  bool skip;
  void operator=(const Message& m) const {
    if (skip) {
      state().skipped = true;
      std::printf("  skipped: %s\n", m.os.str().c_str());
    } else {
      state().failed = true;
      std::printf("%s:%d: Failure\n  %s\n  %s\n", file, line, what.c_str(), m.os.str().c_str());
    }
  }
};

template <typename A, typename B, typename T>
std::string near_msg(const char* ea, const char* eb, const A& a, const B& b, const T& tol) {
  std::ostringstream os;
  os.precision(9);
  os << ea << " = " << a << " vs " << eb << " = " << b << ": difference " << std::fabs(double(a) - double(b))
     << " exceeds " << tol;
  return os.str();
}

}  // namespace shim

#define TEST(S, N)                                                  \
  static void S##_##N##_body();                                     \
  static ::shim::Registrar S##_##N##_registrar(#S, #N, S##_##N##_body); \
  static void S##_##N##_body()

#define SHIM_CHECK_(cond, what, fatal_return) \
  if (cond) {                                 \
  } else                                      \
    fatal_return ::shim::Reporter{__FILE__, __LINE__, what, false} = ::shim::Message()

#define ASSERT_TRUE(c) SHIM_CHECK_((c), "expected true: " #c, return)
#define EXPECT_TRUE(c) SHIM_CHECK_((c), "expected true: " #c, )
#define EXPECT_FALSE(c) SHIM_CHECK_(!(c), "expected false: " #c, )
#define ASSERT_EQ(a, b) SHIM_CHECK_((a) == (b), "expected equal: " #a " == " #b, return)
#define EXPECT_EQ(a, b) SHIM_CHECK_((a) == (b), "expected equal: " #a " == " #b, )
#define ASSERT_NEAR(a, b, tol) \
  SHIM_CHECK_(std::fabs(double(a) - double(b)) <= double(tol), ::shim::near_msg(#a, #b, a, b, tol), return)
#define EXPECT_NEAR(a, b, tol) \
  SHIM_CHECK_(std::fabs(double(a) - double(b)) <= double(tol), ::shim::near_msg(#a, #b, a, b, tol), )
#define GTEST_SKIP() return ::shim::Reporter{__FILE__, __LINE__, "", true} = ::shim::Message()

int main() {
  int failed = 0, skipped = 0;
  for (const auto& t : ::shim::registry()) {
    ::shim::state() = {};
    std::printf("[ RUN      ] %s.%s\n", t.suite, t.name);
    std::fflush(stdout);
    t.fn();
    const char* verdict = ::shim::state().failed ? "[  FAILED  ]" : ::shim::state().skipped ? "[  SKIPPED ]" : "[       OK ]";
    failed += ::shim::state().failed;
    skipped += ::shim::state().skipped;
    std::printf("%s %s.%s\n", verdict, t.suite, t.name);
  }
  std::printf("[==========] %zu tests, %d failed, %d skipped\n", ::shim::registry().size(), failed, skipped);
  return failed ? 1 : 0;
}
