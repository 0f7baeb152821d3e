// A minimal test harness: CHECK records a failure and goes on; main returns
// the count so meson test reports it.
#pragma once

#include <cstdio>
#include <cstring>

static int g_failures = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                          \
    }                                                                        \
  } while (0)

#define CHECK_CONTAINS(haystack, needle) CHECK(std::strstr((haystack), (needle)) != nullptr)

inline int finish(const char* name) {
  if (g_failures == 0) std::printf("%s: all checks passed\n", name);
  else std::printf("%s: %d checks failed\n", name, g_failures);
  return g_failures == 0 ? 0 : 1;
}
