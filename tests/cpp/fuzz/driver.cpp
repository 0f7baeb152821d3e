// A seeded random driver over the C ABI (libFuzzer is not available with g++).
//
// For every entry point that takes tensors it builds random CPU DLTensors:
// random ndim (wrong ones too), sizes, dtypes (valid and invalid), strides
// (contiguous, strided, transposed, padded, zero, negative), index values
// (valid, negative, huge, int32/int64 extremes), NULL tensors, page sizes from
// 0 to INT64_MAX. Every tensor lives in a byte buffer with canary guard
// regions before and after the span its strides can reach; holes between
// strided elements hold random bytes too.
//
// A case is either clean (every argument valid by the headers' contracts) or
// carries exactly one defect. Checks after every call:
//   - clean: MLACORE_OK, and every buffer equals a reference image computed
//     here from the documented semantics (slot mapping, block table, batch
//     positions, both appends: byte for byte; plan: schedule invariants;
//     decode: attention in double precision within bf16/fp16 tolerance);
//   - defect: MLACORE_ERROR_VALUE or _TYPE (RUNTIME only where documented),
//     with a non-empty mlacore_last_error() naming an argument, and no
//     buffer changed;
//   - always: the guard regions are intact and nothing outside the targets'
//     elements changed. ASan/UBSan (tests/run.sh) catch out-of-range reads.
//
// Budget: MLACORE_FUZZ_SECONDS (default 6) split over the entry points, at
// least MLACORE_FUZZ_MIN_CASES (default 40) each. MLACORE_FUZZ_SEED (default
// fixed; "random" for a time-based one) seeds everything; a failure prints
// the entry point and case index, and MLACORE_FUZZ_CASE=<entry>:<index>
// replays that one case.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "ops.h"

namespace fuzz {
namespace {

struct Entry {
  const char* name;
  void (*run)(Rng&, Counter&);
};

const Entry kEntries[] = {
    {"slot_mapping", fuzz_slot_mapping},
    {"page_indices_from_block_table", fuzz_block_table},
    {"batch_indices_positions", fuzz_batch_positions},
    {"combined_kv_view+explain", fuzz_kv_layout},
    {"append_paged_mla_kv_cache", fuzz_append_mla},
    {"append_paged_kv_cache", fuzz_append_kv},
    {"plan_create+build", fuzz_plan},
    {"mla_decode", fuzz_decode},
};
constexpr int kNumEntries = int(sizeof(kEntries) / sizeof(kEntries[0]));

void run_case(int e, int64_t index, Counter& c) {
  g_entry = kEntries[e].name;
  g_case = index;
  g_desc.clear();
  Rng r(mix(mix(g_seed, uint64_t(e) + 1), uint64_t(index)));
  const auto t0 = std::chrono::steady_clock::now();
  kEntries[e].run(r, c);
  c.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The AITER probe raced by 16 threads at once, before anything else in this
// process probed: every thread must get the same answer (the binding holds
// the GIL, so only a C++ test can race the probe itself).
void race_backend_probe() {
  constexpr int kThreads = 16;
  std::atomic<int> arrived{0};
  int32_t avail[kThreads][2];
  const char* reason[kThreads][2];
  mlacore_status st[kThreads][2];
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      arrived.fetch_add(1);
      while (arrived.load() < kThreads) {
      }
      st[i][0] = mlacore_backend_info("aiter", &avail[i][0], &reason[i][0]);
      st[i][1] = mlacore_backend_info("native", &avail[i][1], &reason[i][1]);
    });
  for (std::thread& t : threads) t.join();
  g_entry = "backend_info race";
  for (int i = 0; i < kThreads; ++i)
    for (int k = 0; k < 2; ++k)
      if (st[i][k] != MLACORE_OK || avail[i][k] != avail[0][k] || std::strcmp(reason[i][k], reason[0][k]) != 0)
        fail("thread " + std::to_string(i) + " got a different backend answer");
  if (avail[0][1] != 1) fail("native backend unavailable");
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

}  // namespace
}  // namespace fuzz

using namespace fuzz;

int main() {
  race_backend_probe();
  // Strict mode must come from the cases alone.
  unsetenv("MLACORE_STRICT");
  const char* seed_env = std::getenv("MLACORE_FUZZ_SEED");
  if (seed_env && std::strcmp(seed_env, "random") == 0)
    g_seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  else
    g_seed = seed_env && *seed_env ? std::strtoull(seed_env, nullptr, 10) : 20240601ull;
  const double seconds = double(env_int("MLACORE_FUZZ_SECONDS", 6));
  const int64_t min_cases = env_int("MLACORE_FUZZ_MIN_CASES", 40);
  Counter counters[kNumEntries];
  for (int e = 0; e < kNumEntries; ++e) counters[e].name = kEntries[e].name;

  if (const char* only = std::getenv("MLACORE_FUZZ_CASE")) {
    // Replay one case: <entry>:<index>.
    const char* colon = std::strrchr(only, ':');
    for (int e = 0; e < kNumEntries && colon; ++e)
      if (std::strncmp(only, kEntries[e].name, size_t(colon - only)) == 0 &&
          std::strlen(kEntries[e].name) == size_t(colon - only))
        run_case(e, std::strtoll(colon + 1, nullptr, 10), counters[e]);
  } else {
    // Round robin in batches of 8; each entry point gets an equal share of
    // the time and at least min_cases cases.
    const double share = seconds / kNumEntries;
    int64_t next[kNumEntries] = {};
    bool more = true;
    while (more && g_failures < 25) {
      more = false;
      for (int e = 0; e < kNumEntries; ++e) {
        if (counters[e].seconds >= share && next[e] >= min_cases) continue;
        more = true;
        for (int k = 0; k < 8; ++k) run_case(e, next[e]++, counters[e]);
      }
    }
  }
  std::printf("fuzz_c_abi: seed %llu (MLACORE_FUZZ_SEED), budget %.0f s (MLACORE_FUZZ_SECONDS)\n",
              (unsigned long long)g_seed, seconds);
  std::printf("  backend_info raced by 16 threads: one answer\n");
  int64_t total = 0;
  for (const Counter& c : counters) {
    std::printf("  %-32s %8lld cases (%lld ok, %lld rejected) in %.1f s\n", c.name, (long long)c.cases,
                (long long)c.ok, (long long)c.errors, c.seconds);
    total += c.cases;
  }
  std::printf("  %-32s %8lld cases\n", "total", (long long)total);
  if (g_failures) std::printf("fuzz_c_abi: %d failures\n", g_failures);
  else std::printf("fuzz_c_abi: all checks passed\n");
  return g_failures == 0 ? 0 : 1;
}
