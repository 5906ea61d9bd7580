#include "core/sys_stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

namespace swiftlet {

size_t peak_rss_bytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return size_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

size_t current_rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? size_t(resident) * size_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace swiftlet
