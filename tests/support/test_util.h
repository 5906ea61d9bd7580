// Small helpers shared by tests: running a built executable, catching an Error's message.
#pragma once

#include "core/error.h"
#include "support/test_paths.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

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

}  // namespace swiftlet::testing
