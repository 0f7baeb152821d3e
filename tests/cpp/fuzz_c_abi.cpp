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
#include <mlacore/mlacore.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t I64MAX = std::numeric_limits<int64_t>::max();
constexpr int64_t I64MIN = std::numeric_limits<int64_t>::min();
constexpr int64_t I32MAX = std::numeric_limits<int32_t>::max();
constexpr int64_t I32MIN = std::numeric_limits<int32_t>::min();

// ---- randomness -----------------------------------------------------------------

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (inclusive), any int64 bounds.
  int64_t range(int64_t lo, int64_t hi) {
    const uint64_t span = uint64_t(hi) - uint64_t(lo) + 1;
    if (span == 0) return int64_t(next());
    return int64_t(uint64_t(lo) + next() % span);
  }
  bool chance(double p) { return double(next() >> 11) * (1.0 / 9007199254740992.0) < p; }
  template <class T>
  T pick(std::initializer_list<T> v) {
    return *(v.begin() + next() % v.size());
  }
};

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0x9e3779b97f4a7c15ull));
  r.next();
  return r.next();
}

// ---- failure reporting ----------------------------------------------------------

int g_failures = 0;
uint64_t g_seed = 0;
const char* g_entry = "";
int64_t g_case = 0;
std::string g_desc;  // what the current case is, for failure messages

void fail(const std::string& what) {
  ++g_failures;
  if (g_failures <= 25)
    std::fprintf(stderr, "FAIL [%s case %lld, seed %llu; replay: MLACORE_FUZZ_SEED=%llu MLACORE_FUZZ_CASE=%s:%lld] %s\n  case: %s\n",
                 g_entry, (long long)g_case, (unsigned long long)g_seed, (unsigned long long)g_seed, g_entry,
                 (long long)g_case, what.c_str(), g_desc.c_str());
}

// ---- dtypes ---------------------------------------------------------------------

const DLDataType I32{kDLInt, 32, 1}, I64{kDLInt, 64, 1}, U8{kDLUInt, 8, 1};
const DLDataType F16{kDLFloat, 16, 1}, BF16{kDLBfloat, 16, 1}, F32{kDLFloat, 32, 1};

bool same(const DLDataType& a, const DLDataType& b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

// A dtype that none of `allowed` is, drawn from valid-looking and malformed ones.
DLDataType bad_dtype(Rng& r, std::initializer_list<DLDataType> allowed) {
  static const DLDataType pool[] = {
      {kDLInt, 32, 1},   {kDLInt, 64, 1},  {kDLFloat, 32, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1},
      {kDLFloat, 64, 1}, {kDLInt, 8, 1},   {kDLUInt, 8, 1},   {kDLInt, 16, 1},   {kDLUInt, 32, 1},
      {kDLUInt, 64, 1},  {kDLBool, 8, 1},  {kDLInt, 32, 2},   {kDLInt, 64, 0},   {kDLComplex, 64, 1},
      {kDLFloat, 8, 1},  {kDLInt, 0, 1},   {kDLBfloat, 32, 1}, {kDLFloat, 16, 4}, {kDLOpaqueHandle, 64, 1}};
  for (;;) {
    const DLDataType d = pool[r.next() % (sizeof(pool) / sizeof(pool[0]))];
    bool ok = true;
    for (const DLDataType& a : allowed) ok = ok && !same(a, d);
    if (ok) return d;
  }
}

int64_t item_bytes(const DLDataType& d) {
  const int64_t b = (int64_t(d.bits) * std::max<int>(d.lanes, 1) + 7) / 8;
  return std::max<int64_t>(b, 1);
}

// ---- guarded buffers and tensors ------------------------------------------------

constexpr int64_t kGuard = 64;
constexpr uint8_t kCanary = 0xCD;

struct Buf {
  std::vector<uint8_t> bytes;   // [guard | payload | guard]
  std::vector<uint8_t> expect;  // the image the buffer must have after the call
};

struct TSpec {
  const char* name = "";
  bool null = false;
  int ndim = 1;
  int64_t shape[9] = {};
  int64_t strides[9] = {};
  bool implicit_strides = false;  // DLTensor.strides = NULL (compact row-major)
  DLDataType dtype = I32;
  DLDevice device{kDLCPU, 0};
  int64_t misalign = 0;  // bytes added to the first element's address (alignment defects)
};

struct Tensor {
  TSpec s;
  DLTensor dl{};
  std::shared_ptr<Buf> buf;
  int64_t origin = 0;  // byte index of element 0 in buf->bytes
  int64_t isz = 1;

  const DLTensor* p() const { return s.null ? nullptr : &dl; }
  int dims() const { return std::max(0, std::min(s.ndim, 9)); }
  int64_t stride(int d) const {
    if (!s.implicit_strides) return s.strides[d];
    int64_t st = 1;
    for (int i = dims() - 1; i > d; --i) st *= s.shape[i];
    return st;
  }
  int64_t size(int d) const { return s.shape[d]; }
  // Address of element 0, as the library sees it (data + byte_offset). For an
  // empty tensor it may lie past the buffer; it is never dereferenced.
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(buf->bytes.data()) + uintptr_t(origin); }
  // Byte index of the element at element offset `el` from element 0.
  int64_t at(int64_t el) const { return origin + el * isz; }
  int64_t offset1(int64_t i) const { return at(i * stride(0)); }
  int64_t get_int(int64_t byte_index) const {
    if (s.dtype.bits == 64) {
      int64_t v;
      std::memcpy(&v, &buf->bytes[size_t(byte_index)], 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, &buf->bytes[size_t(byte_index)], 4);
    return v;
  }
  int64_t rd(int64_t i) const { return get_int(offset1(i)); }
  void put_int(std::vector<uint8_t>& img, int64_t byte_index, int64_t v) const {
    if (s.dtype.bits == 64) {
      std::memcpy(&img[size_t(byte_index)], &v, 8);
    } else {
      const int32_t w = static_cast<int32_t>(v);
      std::memcpy(&img[size_t(byte_index)], &w, 4);
    }
  }
  void set(int64_t i, int64_t v) const { put_int(buf->bytes, offset1(i), v); }
  void expect_set(int64_t i, int64_t v) const { put_int(buf->expect, offset1(i), v); }
};

// Element-offset span [lo, hi] the strides can reach; false when a size is 0
// (nothing addressable).
bool span_of(const TSpec& s, const Tensor& t, int64_t& lo, int64_t& hi) {
  lo = hi = 0;
  const int n = std::max(0, std::min(s.ndim, 9));
  for (int d = 0; d < n; ++d) {
    if (s.shape[d] <= 0) return false;
    const int64_t e = (s.shape[d] - 1) * t.stride(d);
    if (e < 0) lo += e;
    else hi += e;
  }
  return true;
}

// A tensor in its own guarded buffer. `fill` gives the value of every element
// slot of the span (holes between strided elements included).
template <class Fill>
Tensor make(const TSpec& s, Rng& r, Fill&& fill) {
  (void)r;
  Tensor t;
  t.s = s;
  t.isz = item_bytes(s.dtype);
  int64_t lo = 0, hi = -1;
  const bool any = span_of(s, t, lo, hi);
  const int64_t payload = any ? (hi - lo + 1) * t.isz : 0;
  if (payload > (int64_t(64) << 20)) {
    std::fprintf(stderr, "fuzz driver bug: tensor %s spans %lld bytes\n", s.name, (long long)payload);
    std::abort();
  }
  t.buf = std::make_shared<Buf>();
  t.buf->bytes.assign(size_t(2 * kGuard + payload + s.misalign), kCanary);
  t.origin = kGuard + s.misalign + (any ? -lo * t.isz : 0);
  for (int64_t b = kGuard + s.misalign; b + t.isz <= kGuard + s.misalign + payload; b += t.isz) fill(t, b);
  return t;
}

// A view into an existing buffer (halves of one cache, layer slices).
Tensor view(const TSpec& s, const std::shared_ptr<Buf>& buf, int64_t origin) {
  Tensor t;
  t.s = s;
  t.isz = item_bytes(s.dtype);
  t.buf = buf;
  t.origin = origin;
  return t;
}

// Fills the DLTensor once the spec is final; data/byte_offset split at random.
void finalize(Tensor& t, Rng& r) {
  t.dl.ndim = t.s.ndim;
  t.dl.shape = t.s.shape;
  t.dl.strides = t.s.implicit_strides ? nullptr : t.s.strides;
  t.dl.dtype = t.s.dtype;
  t.dl.device = t.s.device;
  if (r.chance(0.3)) {
    t.dl.byte_offset = uint64_t(t.origin);
    t.dl.data = t.buf->bytes.data();
  } else {
    t.dl.byte_offset = 0;
    t.dl.data = reinterpret_cast<void*>(t.address());
  }
}

void fill_random_bytes(Rng& r, Tensor& t, int64_t b) {
  for (int64_t i = 0; i < t.isz; ++i) t.buf->bytes[size_t(b + i)] = uint8_t(r.next());
}

// ---- layouts ----------------------------------------------------------------------

TSpec spec(const char* name, DLDataType dtype, std::initializer_list<int64_t> shape) {
  TSpec s;
  s.name = name;
  s.dtype = dtype;
  s.ndim = int(shape.size());
  int i = 0;
  for (int64_t v : shape) s.shape[i++] = v;
  int64_t st = 1;
  for (int d = s.ndim - 1; d >= 0; --d) {
    s.strides[d] = st;
    st *= std::max<int64_t>(s.shape[d], 1);
  }
  return s;
}

// 1-D: unit, strided, reversed or broadcast (stride 0).
void layout1(TSpec& s, Rng& r, bool allow_negative) {
  const int k = int(r.range(0, 9));
  s.implicit_strides = k == 0;
  const int64_t options[] = {1, 1, 2, 3, 7, 0, -1, -2, 1, 1};
  int64_t st = options[k];
  if (st < 0 && !allow_negative) st = -st;
  s.strides[0] = st;
}

// N-D: compact (implicit or explicit), padded, permuted (transposed), with a
// broadcast or a reversed dim. `last_contig` keeps the last dim at stride 1.
void layoutN(TSpec& s, Rng& r, bool last_contig) {
  const int n = s.ndim;
  const int mode = int(r.range(0, 5));
  if (mode == 0) {
    s.implicit_strides = true;
    return;
  }
  s.implicit_strides = false;
  int order[9];
  for (int i = 0; i < n; ++i) order[i] = i;  // order[0] is the innermost dim
  for (int i = 0; i < n / 2; ++i) std::swap(order[i], order[n - 1 - i]);
  if (mode == 3) {  // permute (keeping the last dim innermost when required)
    const int first = last_contig ? 1 : 0;
    for (int i = n - 1; i > first; --i) std::swap(order[i], order[first + int(r.range(0, i - first))]);
  }
  int64_t run = 1;
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    s.strides[d] = run;
    const int64_t pad = (mode == 2 || mode == 4) ? r.range(0, 3) : 0;
    run = run * std::max<int64_t>(s.shape[d], 1) + pad * run;
  }
  if (mode == 4 && n > 1) s.strides[r.range(0, n - 2)] = 0;  // broadcast a non-last dim
  if (mode == 5 && n > 0) {
    const int d = int(r.range(0, last_contig && n > 1 ? n - 2 : n - 1));
    s.strides[d] = -s.strides[d];
  }
}

// ---- index values ----------------------------------------------------------------

// An index value: mostly in [0, hi), sometimes just outside, sometimes extreme.
int64_t index_value(Rng& r, int64_t hi, int64_t extra_special = -1) {
  if (r.chance(0.8) && hi > 0) return r.range(0, hi - 1);
  switch (r.range(0, 10)) {
    case 0: return -1;
    case 1: return hi;
    case 2: return r.range(-100, -1);
    case 3: return I32MAX;
    case 4: return I32MIN;
    case 5: return I64MAX;
    case 6: return I64MIN;
    case 7: return (int64_t(1) << 31) + r.range(-2, 2);
    case 8: return extra_special;
    case 9: return r.range(hi, hi + 1000);
    default: return int64_t(r.next());
  }
}

// ---- call checking -------------------------------------------------------------------

struct Counter {
  const char* name;
  int64_t cases = 0, ok = 0, errors = 0;
  double seconds = 0;
};

bool names_one_of(const char* msg, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (std::strstr(msg, n) != nullptr) return true;
  return false;
}

// Checks the status against the case kind. Returns true when the call
// succeeded (the caller then compares results).
bool check_status(Counter& c, mlacore_status st, bool defect, bool runtime_ok,
                  std::initializer_list<const char*> names) {
  const char* msg = mlacore_last_error();
  if (st == MLACORE_OK) {
    ++c.ok;
    if (defect) fail("accepted an invalid call (MLACORE_OK)");
    return true;
  }
  ++c.errors;
  if (!defect) {
    fail(std::string("rejected a valid call: status ") + std::to_string(int(st)) + ": " + msg);
    return false;
  }
  const bool status_ok = st == MLACORE_ERROR_VALUE || st == MLACORE_ERROR_TYPE ||
                         (runtime_ok && st == MLACORE_ERROR_RUNTIME);
  if (!status_ok) fail(std::string("unexpected status ") + std::to_string(int(st)) + ": " + msg);
  if (msg == nullptr || msg[0] == '\0') fail("error without a message");
  else if (!names_one_of(msg, names)) fail(std::string("error names no argument: ") + msg);
  return false;
}

// Guards intact and every buffer equal to its expected image.
void check_buffers(const std::vector<std::shared_ptr<Buf>>& bufs) {
  for (size_t k = 0; k < bufs.size(); ++k) {
    const Buf& b = *bufs[k];
    const size_t n = b.bytes.size();
    for (size_t i = 0; i < size_t(kGuard) && i < n; ++i)
      if (b.bytes[i] != kCanary || b.bytes[n - 1 - i] != kCanary) {
        fail("canary overwritten in buffer " + std::to_string(k));
        break;
      }
    if (b.bytes != b.expect) {
      size_t i = 0;
      while (i < n && b.bytes[i] == b.expect[i]) ++i;
      fail("buffer " + std::to_string(k) + " differs from the reference at byte " + std::to_string(i) + " of " +
           std::to_string(n) + " (got " + std::to_string(b.bytes[i]) + ", want " + std::to_string(b.expect[i]) + ")");
    }
  }
}

void snapshot(const std::vector<std::shared_ptr<Buf>>& bufs) {
  for (const auto& b : bufs) b->expect = b->bytes;
}

// ---- defects applied to a spec -------------------------------------------------------

enum class Def { None, Null, Ndim, Dtype, Device, Malformed };

// Applies one generic defect to `s`; `allowed` are the dtypes it may have.
// Returns true when the defect makes the call invalid for sure, false when
// it turned out harmless (the caller then treats the case as clean).
bool apply_generic(TSpec& s, Rng& r, Def d, std::initializer_list<DLDataType> allowed, bool* runtime_ok) {
  switch (d) {
    case Def::Null:
      s.null = true;
      return true;
    case Def::Ndim: {
      const int old = s.ndim;
      int n;
      do n = int(r.range(0, 6)); while (n == old);
      for (int i = old; i < n; ++i) {
        s.shape[i] = 1;
        s.strides[i] = 1;
      }
      s.ndim = n;
      return true;
    }
    case Def::Dtype:
      s.dtype = bad_dtype(r, allowed);
      return true;
    case Def::Device: {
      // Only devices this build cannot run on: the buffers are host memory, so
      // a GPU type the build supports would be launched on (and, with no GPU
      // present, fail inside the runtime without naming an argument).
      DLDeviceType types[4];
      int n = 0;
      if (!mlacore_built_with("cuda")) types[n++] = kDLCUDA;
      if (!mlacore_built_with("hip")) types[n++] = kDLROCM;
      types[n++] = kDLVulkan;
      types[n++] = kDLExtDev;
      const DLDeviceType type = types[r.range(0, n - 1)];
      s.device = {type, int32_t(r.range(0, 1))};
      if (type == kDLCUDA || type == kDLROCM) *runtime_ok = true;  // "built without CUDA/HIP" is a RUNTIME error
      return true;
    }
    case Def::Malformed: {
      const int k = int(r.range(0, 2));
      if (k == 0) s.ndim = 9;
      else if (k == 1) s.ndim = -1;
      else if (s.ndim > 0) s.shape[r.range(0, s.ndim - 1)] = -r.range(1, 5);
      else s.ndim = 12;
      return true;
    }
    default:
      return false;
  }
}

Def random_generic(Rng& r) { return Def(r.range(1, 5)); }

// ---- reference semantics --------------------------------------------------------------

// The slot of (b, pos) per slot_mapping.h / page_table.h: -1 when the batch
// index, the indptr range, the position or the page id is out of range. With
// num_pages < 0 a page id must keep every slot of its page within int64.
int64_t ref_slot(const Tensor& idx, const Tensor& ptr, int64_t batch, int64_t page_size, int64_t num_pages,
                 int64_t b, int64_t pos) {
  if (b < 0 || b >= batch || pos < 0) return -1;
  const int64_t begin = ptr.rd(b), end = ptr.rd(b + 1);
  if (!(begin >= 0 && begin <= end && end <= idx.size(0))) return -1;
  const int64_t k = pos / page_size;
  if (k >= end - begin) return -1;
  const int64_t page = idx.rd(begin + k);
  const int64_t bound = num_pages >= 0 ? num_pages : I64MAX / page_size;
  if (page < 0 || page >= bound) return -1;
  const __int128 slot = (__int128)page * page_size + pos % page_size;
  if (slot > I64MAX) {
    fail("reference: slot overflows int64");
    return -1;
  }
  return int64_t(slot);
}

// A monotone indptr of n+1 entries within [0, limit], then sometimes corrupted.
void fill_indptr(Rng& r, const Tensor& t, int64_t n, int64_t limit, double corrupt) {
  if (t.s.null || t.s.ndim != 1 || t.size(0) != n + 1) return;
  int64_t v = r.chance(0.9) ? 0 : r.range(0, std::min<int64_t>(limit, 5));
  for (int64_t i = 0; i <= n; ++i) {
    if (i > 0) v = std::min(limit, v + r.range(0, 5));
    int64_t w = v;
    if (r.chance(corrupt)) w = index_value(r, limit + 2, limit);
    t.set(i, w);
  }
}

// Fill helpers for index tensors of either width.
auto fill_index(Rng& r, int64_t hi, int64_t special = -1) {
  return [&r, hi, special](Tensor& t, int64_t b) {
    const int64_t v = index_value(r, hi, special);
    if (t.isz == 8) std::memcpy(&t.buf->bytes[size_t(b)], &v, 8);
    else if (t.isz == 4) {
      const int32_t w = int32_t(v);
      std::memcpy(&t.buf->bytes[size_t(b)], &w, 4);
    } else {
      fill_random_bytes(r, t, b);
    }
  };
}

auto fill_bytes(Rng& r) {
  return [&r](Tensor& t, int64_t b) { fill_random_bytes(r, t, b); };
}

bool is_index(const DLDataType& d) { return same(d, I32) || same(d, I64); }

// =============================================================================
// slot mapping
// =============================================================================

void fuzz_slot_mapping(Rng& r, Counter& c) {
  const DLDataType tok = r.chance(0.5) ? I32 : I64, idt = r.chance(0.5) ? I32 : I64;
  const int64_t nnz = r.range(0, 40), batch = r.range(0, 6);
  int64_t page_size = r.pick<int64_t>({1, 1, 2, 3, 16, 16, 64, 4096, int64_t(1) << 20, int64_t(1) << 40, I64MAX});
  const bool huge_l = r.chance(0.05);
  const int64_t num_indices = huge_l ? (int64_t(1) << 40) + r.range(0, 99) : r.range(0, 30);
  const int64_t limit = I64MAX / page_size;
  int64_t num_pages = r.pick<int64_t>({-1, -1, -7, 0, r.range(1, 40), r.range(1, 40),
                                       (int64_t(1) << 31) / page_size + r.range(0, 3), limit, r.range(1, limit)});
  TSpec bi = spec("batch_indices", tok, {nnz}), pos = spec("positions", tok, {nnz});
  TSpec idx = spec("kv_indices", idt, {num_indices}), ptr = spec("kv_indptr", idt, {batch + 1});
  TSpec out = spec("out", I64, {nnz});
  for (TSpec* s : {&bi, &pos, &idx, &ptr, &out}) layout1(*s, r, true);
  if (huge_l) idx.strides[0] = 0, idx.implicit_strides = false;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    TSpec* all[] = {&bi, &pos, &idx, &ptr, &out};
    switch (r.range(0, 7)) {
      case 0: case 1: {
        TSpec* s = all[r.range(0, 4)];
        const Def d = random_generic(r);
        if (d == Def::Device && s == &bi) s = &pos;  // a device defect is a mismatch with the anchor
        apply_generic(*s, r, d, {s == &out ? I64 : s->dtype}, &runtime_ok);
        if (d == Def::Dtype && s != &out && is_index(s->dtype)) s->dtype = F32;
        break;
      }
      case 2: pos.shape[0] = nnz + r.range(1, 3); break;
      case 3: pos.dtype = same(tok, I32) ? I64 : I32; break;
      case 4: idx.dtype = same(idt, I32) ? I64 : I32; break;
      case 5: ptr.shape[0] = 0; break;
      case 6: out.shape[0] = nnz + r.range(1, 3); break;
      default:
        if (r.chance(0.5)) page_size = r.pick<int64_t>({0, -1, -64, I64MIN});
        else if (limit < I64MAX) num_pages = r.range(limit + 1, I64MAX);
        else page_size = 0;
        break;
    }
  }
  if (num_pages > I64MAX / std::max<int64_t>(page_size, 1)) defect = true;  // num_pages * page_size must fit
  const int64_t np_eff = num_pages >= 0 ? std::min<int64_t>(num_pages, 64) : 64;
  const int64_t ps_eff = page_size >= 1 ? page_size : 1;
  Tensor tb = make(bi, r, fill_index(r, batch, batch));
  Tensor tp = make(pos, r, [&](Tensor& t, int64_t b) {
    int64_t v;
    if (r.chance(0.8)) v = r.range(0, std::min<int64_t>(ps_eff, I64MAX / 8) * 6);
    else v = index_value(r, 0, ps_eff);
    if (t.isz == 8) std::memcpy(&t.buf->bytes[size_t(b)], &v, 8);
    else if (t.isz == 4) { const int32_t w = int32_t(v); std::memcpy(&t.buf->bytes[size_t(b)], &w, 4); }
    else fill_random_bytes(r, t, b);
  });
  Tensor ti = make(idx, r, fill_index(r, np_eff, r.chance(0.5) ? limit - 1 : limit));
  Tensor tq = make(ptr, r, fill_bytes(r));
  if (is_index(ptr.dtype)) fill_indptr(r, tq, batch, std::min<int64_t>(num_indices, 40), 0.1);
  Tensor to = make(out, r, fill_bytes(r));
  for (Tensor* t : {&tb, &tp, &ti, &tq, &to}) finalize(*t, r);
  std::vector<std::shared_ptr<Buf>> bufs = {tb.buf, tp.buf, ti.buf, tq.buf, to.buf};
  snapshot(bufs);
  g_desc = "nnz=" + std::to_string(nnz) + " batch=" + std::to_string(batch) + " page_size=" + std::to_string(page_size) +
           " num_pages=" + std::to_string(num_pages) + " num_indices=" + std::to_string(num_indices);

  ++c.cases;
  const mlacore_status st =
      mlacore_slot_mapping(tb.p(), tp.p(), ti.p(), tq.p(), page_size, num_pages, to.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"batch_indices", "positions", "kv_indices", "kv_indptr", "out", "page_size", "num_pages"})) {
    for (int64_t t = 0; t < nnz; ++t)
      to.expect_set(t, ref_slot(ti, tq, batch, page_size, num_pages, tb.rd(t), tp.rd(t)));
  }
  check_buffers(bufs);
}

// =============================================================================
// page indices from a block table
// =============================================================================

void fuzz_block_table(Rng& r, Counter& c) {
  const DLDataType tdt = r.chance(0.5) ? I32 : I64, cdt = r.chance(0.5) ? I32 : I64;
  const int64_t rows = r.range(0, 6);
  const bool huge_cols = r.chance(0.05);
  const int64_t cols = huge_cols ? (int64_t(1) << 40) : r.range(0, 8);
  const int64_t out_len = r.range(0, 40);
  TSpec table = spec("block_table", tdt, {rows, cols}), cu = spec("cu_num_blocks", cdt, {rows + 1});
  TSpec out = spec("out", tdt, {out_len});
  layoutN(table, r, false);
  if (huge_cols) table.implicit_strides = false, table.strides[1] = 0, table.strides[0] = 1;
  layout1(cu, r, true);
  layout1(out, r, true);

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 5)) {
      case 0: case 1: {
        TSpec* all[] = {&table, &cu, &out};
        TSpec* s = all[r.range(0, 2)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &table) s = &cu;
        if (d == Def::Ndim && s == &table && rows == 0) d = Def::Null;  // a 1-D table of 0 rows... keep it simple
        apply_generic(*s, r, d, {I32, I64}, &runtime_ok);
        break;
      }
      case 2: cu.shape[0] = rows + 1 + r.pick<int64_t>({-1, 1, 2}); break;
      case 3: out.dtype = same(tdt, I32) ? I64 : I32; break;
      case 4: out.ndim = 2, out.shape[1] = 1, out.strides[1] = 1; break;
      default: table.ndim = r.pick(std::initializer_list<int>{1, 3}), table.shape[2] = 1, table.strides[2] = 1; break;
    }
  }
  Tensor tt = make(table, r, fill_index(r, 1000));
  Tensor tc = make(cu, r, fill_bytes(r));
  if (is_index(cu.dtype) && cu.ndim == 1 && cu.shape[0] == rows + 1) {
    int64_t v = r.chance(0.8) ? 0 : r.range(-3, 10);
    for (int64_t i = 0; i <= rows; ++i) {
      if (i > 0) v += r.range(0, std::min<int64_t>(cols, 8) + 2);
      tc.set(i, r.chance(0.1) ? index_value(r, out_len + 3, out_len) : v);
    }
  }
  Tensor to = make(out, r, fill_bytes(r));
  for (Tensor* t : {&tt, &tc, &to}) finalize(*t, r);
  std::vector<std::shared_ptr<Buf>> bufs = {tt.buf, tc.buf, to.buf};
  snapshot(bufs);
  g_desc = "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) + " out_len=" + std::to_string(out_len);

  ++c.cases;
  const mlacore_status st = mlacore_page_indices_from_block_table(tt.p(), tc.p(), to.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok, {"block_table", "cu_num_blocks", "out"})) {
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t begin = tc.rd(row), end = tc.rd(row + 1);
      if (begin < 0 || end < begin || begin >= out_len) continue;
      const int64_t n = std::min({end - begin, cols, out_len - begin});
      for (int64_t j = 0; j < n; ++j)
        to.expect_set(begin + j, tt.get_int(tt.at(row * tt.stride(0) + j * tt.stride(1))));
    }
  }
  check_buffers(bufs);
}

// =============================================================================
// batch indices and positions
// =============================================================================

void fuzz_batch_positions(Rng& r, Counter& c) {
  const DLDataType idt = r.chance(0.5) ? I32 : I64, odt = r.chance(0.5) ? I32 : I64;
  const int64_t batch = r.range(0, 6), nnz = r.range(0, 40);
  TSpec ptr = spec("append_indptr", idt, {batch + 1}), lens = spec("seq_lens", idt, {batch});
  TSpec bi = spec("batch_indices", odt, {nnz}), pos = spec("positions", odt, {nnz});
  for (TSpec* s : {&ptr, &lens, &bi, &pos}) layout1(*s, r, true);
  const bool corrupt = r.chance(0.3);
  // Outputs with distinct elements when indptr may be non-monotone: then
  // every written pair is checked on its own (see below).
  if (corrupt)
    for (TSpec* s : {&bi, &pos})
      if (s->strides[0] == 0) s->strides[0] = 1;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 6)) {
      case 0: case 1: {
        TSpec* all[] = {&ptr, &lens, &bi, &pos};
        TSpec* s = all[r.range(0, 3)];
        const Def d = random_generic(r);
        if (d == Def::Device && s == &ptr) s = &bi;
        apply_generic(*s, r, d, {I32, I64}, &runtime_ok);
        break;
      }
      case 2: ptr.shape[0] = 0, lens.shape[0] = 0; break;
      case 3: lens.shape[0] = batch + r.pick<int64_t>({-1, 1}); if (lens.shape[0] < 0) lens.shape[0] = 1; break;
      case 4: lens.dtype = same(idt, I32) ? I64 : I32; break;
      case 5: pos.shape[0] = nnz + r.range(1, 3); break;
      default: pos.dtype = same(odt, I32) ? I64 : I32; break;
    }
  }
  Tensor tp = make(ptr, r, fill_bytes(r));
  bool monotone = true;
  if (is_index(ptr.dtype) && ptr.ndim == 1 && ptr.shape[0] == batch + 1 && !ptr.null) {
    int64_t v = r.chance(0.8) ? 0 : r.range(-5, 10);
    for (int64_t i = 0; i <= batch; ++i) {
      if (i > 0) v += r.range(0, 9);
      tp.set(i, corrupt && r.chance(0.3) ? index_value(r, nnz + 3, nnz) : v);
    }
    for (int64_t i = 0; i < batch; ++i) monotone = monotone && tp.rd(i) <= tp.rd(i + 1);
  }
  Tensor tl = make(lens, r, [&](Tensor& t, int64_t b) {
    const int64_t v = r.chance(0.7) ? r.range(0, 30) : index_value(r, 30, I32MAX - r.range(0, 3));
    if (t.isz == 8) std::memcpy(&t.buf->bytes[size_t(b)], &v, 8);
    else if (t.isz == 4) { const int32_t w = int32_t(v); std::memcpy(&t.buf->bytes[size_t(b)], &w, 4); }
    else fill_random_bytes(r, t, b);
  });
  Tensor tb = make(bi, r, fill_bytes(r)), to = make(pos, r, fill_bytes(r));
  for (Tensor* t : {&tp, &tl, &tb, &to}) finalize(*t, r);
  std::vector<std::shared_ptr<Buf>> bufs = {tp.buf, tl.buf, tb.buf, to.buf};
  snapshot(bufs);
  g_desc = "batch=" + std::to_string(batch) + " nnz=" + std::to_string(nnz) + (monotone ? " monotone" : " non-monotone");

  ++c.cases;
  const mlacore_status st = mlacore_batch_indices_positions(tp.p(), tl.p(), tb.p(), to.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok, {"append_indptr", "seq_lens", "batch_indices", "positions"})) {
    const int64_t out_max = same(odt, I32) ? I32MAX : I64MAX;
    auto position = [&](int64_t b, int64_t t) -> int64_t {
      const int64_t seq_len = tl.rd(b);
      const __int128 p = (__int128)seq_len - tp.rd(b + 1) + t;
      return seq_len < 0 || p < 0 || p > out_max ? -1 : int64_t(p);
    };
    for (int64_t t = 0; t < nnz; ++t) {
      if (monotone) {
        int64_t b = -1;
        if (batch > 0 && tp.rd(0) <= t && t < tp.rd(batch))
          for (int64_t k = 0; k < batch; ++k)
            if (tp.rd(k) <= t) b = k;
        tb.expect_set(t, b);
        to.expect_set(t, b < 0 ? -1 : position(b, t));
      } else {
        // Non-monotone indptr: whichever request the search lands on must
        // cover t, and its position must be right.
        const int64_t b = tb.rd(t), p = to.rd(t);
        if (b == -1) {
          if (p != -1) fail("token " + std::to_string(t) + ": batch index -1 with position " + std::to_string(p));
        } else if (b < 0 || b >= batch || !(tp.rd(b) <= t && t < tp.rd(b + 1))) {
          fail("token " + std::to_string(t) + " assigned to request " + std::to_string(b) + " that does not cover it");
        } else if (p != position(b, t)) {
          fail("token " + std::to_string(t) + ": position " + std::to_string(p) + ", want " +
               std::to_string(position(b, t)));
        }
        tb.expect_set(t, b);
        to.expect_set(t, p);
      }
    }
  }
  check_buffers(bufs);
}

// =============================================================================
// combined_kv_view / explain_kv_layout
// =============================================================================

void fuzz_kv_layout(Rng& r, Counter& c) {
  const int64_t P = r.range(0, 4), S = r.range(0, 4), dc = r.range(1, 16), dp = r.range(1, 8);
  const DLDataType dt = r.pick({BF16, F16, F32, I32, U8});
  // A parent [L, P, S, W] buffer (W = dc + dp, maybe padded) whose halves are
  // ckv and kpe, then perturbations that may or may not break adjacency.
  const int64_t W = dc + dp, pad = r.chance(0.2) ? r.range(1, 3) : 0, L = r.range(1, 2);
  TSpec parent = spec("parent", dt, {L, P, S, W + pad});
  if (r.chance(0.2)) parent.strides[1] = parent.strides[1] + r.range(1, 8);  // padded pages
  Tensor tpar = make(parent, r, fill_bytes(r));
  const int64_t layer = r.range(0, L - 1);
  TSpec ckv = spec("ckv_cache", dt, {P, S, dc}), kpe = spec("kpe_cache", dt, {P, S, dp});
  for (TSpec* s : {&ckv, &kpe}) {
    s->strides[0] = parent.strides[1];
    s->strides[1] = parent.strides[2];
    s->strides[2] = 1;
  }
  const int64_t base = tpar.at(layer * parent.strides[0]);
  int64_t kpe_origin = base + dc * tpar.isz;
  std::shared_ptr<Buf> kpe_buf = tpar.buf;
  std::vector<std::shared_ptr<Buf>> bufs = {tpar.buf};
  Tensor sep;
  bool defect = false, runtime_ok = false;
  switch (r.range(0, 12)) {
    case 0: kpe_origin = base - dp * tpar.isz + (int64_t(W + pad) * tpar.isz) * 0; break;  // reversed
    case 1: {  // separate allocation
      sep = make(spec("sep", dt, {P, S, dp}), r, fill_bytes(r));
      kpe_buf = sep.buf;
      kpe_origin = sep.origin;
      kpe.strides[0] = sep.stride(0), kpe.strides[1] = sep.stride(1);
      bufs.push_back(sep.buf);
      break;
    }
    case 2: kpe.dtype = bad_dtype(r, {dt}); break;
    case 3: kpe.device = {kDLCUDA, 0}; break;
    case 4: kpe.strides[1] += r.pick<int64_t>({-1, 1, 2}); break;
    case 5: kpe.strides[0] += r.pick<int64_t>({-1, 1, 2}); break;
    case 6: ckv.strides[2] = r.pick<int64_t>({2, 0, -1}); break;
    case 7: kpe_origin += tpar.isz * r.pick<int64_t>({-1, 1}); break;
    case 8: ckv.ndim = r.pick(std::initializer_list<int>{2, 4}), ckv.shape[3] = 1, ckv.strides[3] = 1; defect = true; break;
    case 9: kpe.shape[r.range(0, 1)] += 1; defect = true; break;
    case 10: {
      TSpec* s = r.chance(0.5) ? &ckv : &kpe;
      Def d = random_generic(r);
      if (d == Def::Dtype || d == Def::Device) d = Def::Null;  // those only break adjacency
      apply_generic(*s, r, d, {}, &runtime_ok);
      defect = true;
      break;
    }
    default: break;
  }
  if (!ckv.null && ckv.ndim == 3 && ckv.shape[2] < 1) defect = true;
  Tensor tc = view(ckv, tpar.buf, base), tk = view(kpe, kpe_buf, kpe_origin);
  finalize(tc, r);
  finalize(tk, r);
  snapshot(bufs);
  g_desc = "P=" + std::to_string(P) + " S=" + std::to_string(S) + " dc=" + std::to_string(dc) + " dp=" + std::to_string(dp);

  // Reference per kv_layout.h (defects above are exactly the VALUE/TYPE cases).
  bool adjacent = false;
  if (!defect) {
    const bool whole = (int64_t(kpe.dtype.bits) * kpe.dtype.lanes) % 8 == 0 && kpe.dtype.bits > 0 && kpe.dtype.lanes > 0;
    if (!whole) defect = true;  // kpe_cache: whole bytes per element required
    // By address, as the contract says, not by buffer identity: an empty
    // cache's first element may lie past its own buffer, exactly where a
    // separate allocation begins (seen in CI: P=1 S=0, F32, dc=14).
    adjacent = whole && kpe.device.device_type == kDLCPU && same(kpe.dtype, ckv.dtype) &&
               tk.address() == tc.address() + uintptr_t(dc * tc.isz) &&
               (dc <= 1 || ckv.strides[2] == 1) && (dp <= 1 || kpe.strides[2] == 1) &&
               (S <= 1 || (ckv.strides[1] == W && kpe.strides[1] == W)) && (P <= 1 || kpe.strides[0] == ckv.strides[0]);
  }

  ++c.cases;
  int64_t shape[4] = {-7, -7, -7, -7}, strides[4] = {-7, -7, -7, -7};
  int32_t adj = -7;
  const int nulls = r.chance(0.05) ? int(r.range(1, 3)) : 0;
  const mlacore_status st = mlacore_combined_kv_view(tc.p(), tk.p(), nulls == 1 ? nullptr : shape,
                                                     nulls == 2 ? nullptr : strides, nulls == 3 ? nullptr : &adj);
  if (check_status(c, st, defect || nulls != 0, runtime_ok,
                   {"ckv_cache", "kpe_cache", "view_shape", "view_strides", "adjacent"})) {
    if (adj != (adjacent ? 1 : 0)) fail("combined_kv_view: adjacent=" + std::to_string(adj) + ", want " + std::to_string(adjacent));
    if (adj == 1) {
      const int64_t want_shape[3] = {P, S, W}, want_strides[3] = {ckv.strides[0], S > 1 ? ckv.strides[1] : W, 1};
      for (int i = 0; i < 3; ++i)
        if (shape[i] != want_shape[i] || strides[i] != want_strides[i]) fail("combined_kv_view: wrong view");
    } else if (shape[0] != -7 || strides[0] != -7) {
      fail("combined_kv_view: view written for a non-adjacent pair");
    }
    if (shape[3] != -7 || strides[3] != -7) fail("combined_kv_view: wrote past 3 elements");
  }
  check_buffers(bufs);

  // explain: the sentence agrees with the decision and is truncated safely.
  ++c.cases;
  std::vector<char> big(4096, 'x');
  size_t full = 0;
  const mlacore_status st2 = mlacore_explain_kv_layout(tc.p(), tk.p(), big.data(), big.size(), &full);
  if (check_status(c, st2, defect, runtime_ok, {"ckv_cache", "kpe_cache"})) {
    if (full >= big.size() || std::strlen(big.data()) != full) fail("explain_kv_layout: length mismatch");
    else if ((std::strncmp(big.data(), "adjacent", 8) == 0) != adjacent) fail("explain_kv_layout disagrees: " + std::string(big.data()));
    const size_t sizes[] = {0, 1, 2, 7, 40};
    const size_t n = sizes[r.range(0, 4)];
    std::vector<char> small(n + 2 * kGuard, char(kCanary));
    size_t len2 = 0;
    const bool null_buf = n == 0 && r.chance(0.5);
    ++c.cases;
    const mlacore_status st3 = mlacore_explain_kv_layout(tc.p(), tk.p(), null_buf ? nullptr : small.data() + kGuard, n,
                                                         r.chance(0.5) ? &len2 : nullptr);
    if (st3 != MLACORE_OK) fail(std::string("explain_kv_layout with a small buffer failed: ") + mlacore_last_error());
    for (size_t i = 0; i < small.size(); ++i) {
      const bool inside = i >= size_t(kGuard) && i < size_t(kGuard) + n;
      if (!inside && small[i] != char(kCanary)) { fail("explain_kv_layout wrote outside buf"); break; }
    }
    if (n > 0) {
      const size_t k = std::min(n - 1, full);
      if (small[kGuard + k] != '\0' || std::strncmp(small.data() + kGuard, big.data(), k) != 0)
        fail("explain_kv_layout: truncated text is not a NUL-terminated prefix");
    }
  }
  // A NULL buf with a non-zero size is a TYPE error naming buf.
  if (!defect && r.chance(0.1)) {
    ++c.cases;
    const mlacore_status st4 = mlacore_explain_kv_layout(tc.p(), tk.p(), nullptr, 8, nullptr);
    check_status(c, st4, true, false, {"buf"});
  }
}

// =============================================================================
// appends
// =============================================================================

// The index tensors both appends take; clean unless the defect switch says so.
struct AppendIndex {
  TSpec bi, pos, idx, ptr, last;
  Tensor tb, tp, ti, tq, tl;
  int64_t batch = 0;
};

void make_append_index(Rng& r, AppendIndex& a, int64_t nnz) {
  a.batch = r.range(0, 5);
  const DLDataType bdt = r.chance(0.5) ? I32 : I64, pdt = r.chance(0.5) ? I32 : I64, idt = r.chance(0.5) ? I32 : I64;
  const int64_t num_indices = r.range(0, 20);
  a.bi = spec("batch_indices", bdt, {nnz});
  a.pos = spec("positions", pdt, {nnz});
  a.idx = spec("kv_indices", idt, {num_indices});
  a.ptr = spec("kv_indptr", idt, {a.batch + 1});
  a.last = spec("kv_last_page_len", r.chance(0.5) ? I32 : I64, {a.batch});
  for (TSpec* s : {&a.bi, &a.pos, &a.idx, &a.ptr, &a.last}) layout1(*s, r, false);
}

void materialize_append_index(Rng& r, AppendIndex& a, int64_t pages, int64_t page_size,
                              std::vector<std::shared_ptr<Buf>>& bufs) {
  const int64_t ps = std::max<int64_t>(page_size, 1);
  a.tb = make(a.bi, r, fill_index(r, a.batch, a.batch));
  a.tp = make(a.pos, r, fill_index(r, ps * 4, ps));
  a.ti = make(a.idx, r, fill_index(r, pages, pages));
  a.tq = make(a.ptr, r, fill_bytes(r));
  if (is_index(a.ptr.dtype)) fill_indptr(r, a.tq, a.batch, a.idx.ndim == 1 ? a.idx.shape[0] : 0, 0.1);
  a.tl = make(a.last, r, fill_index(r, ps + 1));
  for (Tensor* t : {&a.tb, &a.tp, &a.ti, &a.tq, &a.tl}) {
    finalize(*t, r);
    bufs.push_back(t->buf);
  }
}

// Index-side defects shared by both appends; returns false when none applied.
bool append_index_defect(Rng& r, AppendIndex& a, int64_t nnz, bool* runtime_ok) {
  switch (r.range(0, 6)) {
    case 0: case 1: {
      TSpec* all[] = {&a.bi, &a.pos, &a.idx, &a.ptr, &a.last};
      TSpec* s = all[r.range(0, 4)];
      apply_generic(*s, r, random_generic(r), {I32, I64}, runtime_ok);
      return true;
    }
    case 2: (r.chance(0.5) ? a.bi : a.pos).shape[0] = nnz + r.range(1, 2); return true;
    case 3: a.ptr.shape[0] = a.batch + r.pick<int64_t>({0, 2}); return true;
    case 4: a.idx.dtype = same(a.ptr.dtype, I32) ? I64 : I32; return true;
    case 5: {
      TSpec& s = r.chance(0.5) ? a.bi : a.pos;
      if (s.shape[0] < 2) s.shape[0] = 2, (&s == &a.bi ? a.pos : a.bi).shape[0] = 2;
      s.implicit_strides = false;
      s.strides[0] = -r.range(1, 2);  // appends refuse negative index strides (and the length may differ too)
      return true;
    }
    default: return false;
  }
}

// Applies the reference writes: token i's row of each source into its slot.
struct CopyRef {
  const Tensor* src;
  const Tensor* dst;
  int64_t page_dim, tok_dim, head_dim;  // dims of dst (head_dim < 0: none)
  int64_t extra_off;                    // element offset added (fused V)
  int64_t heads, width;
};

void apply_append_ref(const AppendIndex& a, int64_t pages, int64_t page_size, const std::vector<CopyRef>& copies,
                      int64_t nnz) {
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t slot = ref_slot(a.ti, a.tq, a.batch, page_size, pages, a.tb.rd(i), a.tp.rd(i));
    if (slot < 0) continue;
    const int64_t page = slot / page_size, off = slot % page_size;
    for (const CopyRef& cp : copies) {
      const Tensor& s = *cp.src;
      const Tensor& d = *cp.dst;
      for (int64_t h = 0; h < cp.heads; ++h)
        for (int64_t e = 0; e < cp.width; ++e) {
          const int last_src = s.s.ndim - 1;
          const int64_t src_el = i * s.stride(0) + (cp.head_dim >= 0 ? h * s.stride(1) : 0) + e * s.stride(last_src);
          const int last_dst = d.s.ndim - 1;
          const int64_t dst_el = cp.extra_off + page * d.stride(int(cp.page_dim)) + off * d.stride(int(cp.tok_dim)) +
                                 (cp.head_dim >= 0 ? h * d.stride(int(cp.head_dim)) : 0) + e * d.stride(last_dst);
          std::memcpy(&d.buf->expect[size_t(d.at(dst_el))], &s.buf->bytes[size_t(s.at(src_el))], size_t(s.isz));
        }
    }
  }
}

bool all_tokens_valid(const AppendIndex& a, int64_t pages, int64_t page_size, int64_t nnz) {
  for (int64_t i = 0; i < nnz; ++i)
    if (ref_slot(a.ti, a.tq, a.batch, page_size, pages, a.tb.rd(i), a.tp.rd(i)) < 0) return false;
  return true;
}

void fuzz_append_mla(Rng& r, Counter& c) {
  const DLDataType dt = r.pick({BF16, F16, F32});
  const bool real_dims = r.chance(0.1);
  const int64_t P = r.range(0, 5), S = r.pick<int64_t>({1, 2, 3, 16}), nnz = r.range(0, 20);
  const int64_t dc = real_dims ? 512 : r.range(1, 24), dp = real_dims ? 64 : r.range(1, 12);
  const bool shared = r.chance(0.5);
  TSpec ckv = spec("ckv_cache", dt, {P, S, dc}), kpe = spec("kpe_cache", dt, {P, S, dp});
  TSpec sckv = spec("append_ckv", dt, {nnz, dc}), skpe = spec("append_kpe", dt, {nnz, dp});
  std::shared_ptr<Buf> parent;
  int64_t ckv_origin = 0, kpe_origin = 0;
  if (shared) {
    // Halves of one [L, P, S, dc + dp (+pad)] buffer, one layer of it.
    const int64_t L = r.range(1, 2), W = dc + dp + (r.chance(0.2) ? r.range(1, 3) : 0);
    TSpec ps = spec("parent", dt, {L, P, S, W});
    if (r.chance(0.3)) std::swap(ps.strides[1], ps.strides[2]), ps.strides[1] = W, ps.strides[2] = W * S;  // page-minor
    Tensor tpar = make(ps, r, fill_bytes(r));
    parent = tpar.buf;
    ckv_origin = tpar.at(r.range(0, L - 1) * ps.strides[0]);
    kpe_origin = ckv_origin + dc * tpar.isz;
    for (TSpec* s : {&ckv, &kpe}) s->strides[0] = ps.strides[1], s->strides[1] = ps.strides[2], s->strides[2] = 1;
  } else {
    layoutN(ckv, r, true);
    layoutN(kpe, r, true);
  }
  layoutN(sckv, r, true);
  layoutN(skpe, r, true);
  AppendIndex a;
  make_append_index(r, a, nnz);
  int32_t backend = r.chance(0.5) ? MLACORE_BACKEND_AUTO : MLACORE_BACKEND_NATIVE;
  const int32_t strict = r.chance(0.3) ? 1 : 0;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 9)) {
      case 0: case 1: {
        TSpec* all[] = {&ckv, &kpe, &sckv, &skpe};
        TSpec* s = all[r.range(0, 3)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &ckv) s = &kpe;
        if (shared && (s == &ckv || s == &kpe) && d == Def::Ndim) d = Def::Null;
        apply_generic(*s, r, d, {dt}, &runtime_ok);
        break;
      }
      case 2: case 3: defect = append_index_defect(r, a, nnz, &runtime_ok); break;
      case 4: if (dc > 1) sckv.implicit_strides = false, sckv.strides[1] = 2; else sckv.shape[1] = 2; break;
      case 5: skpe.shape[0] = nnz + 1; break;
      case 6: sckv.shape[1] = dc + 1; break;
      case 7: if (!shared) kpe.shape[r.range(0, 1)] += 1; else backend = 7; break;
      case 8: backend = r.pick<int32_t>({MLACORE_BACKEND_AITER, 3, -1}); runtime_ok = true; break;
      default: if (!shared && dc > 1) ckv.implicit_strides = false, ckv.strides[2] = 2; else backend = 5; break;
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs;
  Tensor tc, tk;
  if (shared) {
    tc = view(ckv, parent, ckv_origin);
    tk = view(kpe, parent, kpe_origin);
    bufs.push_back(parent);
  } else {
    tc = make(ckv, r, fill_bytes(r));
    tk = make(kpe, r, fill_bytes(r));
    bufs.push_back(tc.buf);
    bufs.push_back(tk.buf);
  }
  Tensor ts = make(sckv, r, fill_bytes(r)), tz = make(skpe, r, fill_bytes(r));
  bufs.push_back(ts.buf);
  bufs.push_back(tz.buf);
  for (Tensor* t : {&tc, &tk, &ts, &tz}) finalize(*t, r);
  materialize_append_index(r, a, P, S, bufs);
  snapshot(bufs);
  g_desc = "P=" + std::to_string(P) + " S=" + std::to_string(S) + " nnz=" + std::to_string(nnz) + " dc=" +
           std::to_string(dc) + " dp=" + std::to_string(dp) + (shared ? " shared" : " separate") +
           " strict=" + std::to_string(strict) + " backend=" + std::to_string(backend);
  const bool strict_reject = !defect && strict && !all_tokens_valid(a, P, S, nnz);
  if (strict_reject) defect = true;

  ++c.cases;
  const mlacore_status st = mlacore_append_paged_mla_kv_cache(ts.p(), tz.p(), a.tb.p(), a.tp.p(), tc.p(), tk.p(),
                                                              a.ti.p(), a.tq.p(), a.tl.p(), backend, strict, nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"append_ckv", "append_kpe", "batch_indices", "positions", "ckv_cache", "kpe_cache", "kv_indices",
                    "kv_indptr", "kv_last_page_len", "backend", "(strict): token"})) {
    apply_append_ref(a, P, S, {{&ts, &tc, 0, 1, -1, 0, 1, dc}, {&tz, &tk, 0, 1, -1, 0, 1, dp}}, nnz);
  }
  check_buffers(bufs);
}

void fuzz_append_kv(Rng& r, Counter& c) {
  const DLDataType dt = r.pick({BF16, F16, F32});
  int32_t layout = r.chance(0.5) ? MLACORE_LAYOUT_NHD : MLACORE_LAYOUT_HND;
  const bool nhd = layout == MLACORE_LAYOUT_NHD;
  const bool fused = r.chance(0.4);
  const int64_t P = r.range(0, 4), S = r.pick<int64_t>({1, 2, 3, 8}), H = r.range(1, 3), nnz = r.range(0, 16);
  const int64_t D = r.chance(0.1) ? r.pick<int64_t>({64, 128}) : r.range(1, 16);
  const char* kname = fused ? "paged_kv_cache" : "paged_kv_cache[0]";
  TSpec k = fused ? (nhd ? spec(kname, dt, {P, 2, S, H, D}) : spec(kname, dt, {P, 2, H, S, D}))
                  : (nhd ? spec(kname, dt, {P, S, H, D}) : spec(kname, dt, {P, H, S, D}));
  TSpec v = nhd ? spec("paged_kv_cache[1]", dt, {P, S, H, D}) : spec("paged_kv_cache[1]", dt, {P, H, S, D});
  if (fused) v.null = true;
  TSpec key = spec("append_key", dt, {nnz, H, D}), value = spec("append_value", dt, {nnz, H, D});
  layoutN(k, r, true);
  if (fused && !k.implicit_strides && k.strides[1] == 0) k.strides[1] = 1;  // K and V must not coincide
  layoutN(v, r, true);
  layoutN(key, r, true);
  layoutN(value, r, true);
  AppendIndex a;
  make_append_index(r, a, nnz);
  const int32_t strict = r.chance(0.3) ? 1 : 0;
  int32_t backend = r.chance(0.5) ? MLACORE_BACKEND_AUTO : MLACORE_BACKEND_NATIVE;

  bool defect = false, runtime_ok = false;
  if (r.chance(0.4)) {
    defect = true;
    switch (r.range(0, 8)) {
      case 0: case 1: {
        TSpec* all[] = {&k, &v, &key, &value};
        TSpec* s = all[r.range(0, fused ? 3 : 3)];
        if (fused && s == &v) s = &key;
        Def d = random_generic(r);
        if (d == Def::Device && s == &k) s = &key;
        if (d == Def::Null && s == &v) {  // NULL v_cache selects the fused 5-D form: a 4-D k then fails
        }
        apply_generic(*s, r, d, {dt}, &runtime_ok);
        break;
      }
      case 2: case 3: defect = append_index_defect(r, a, nnz, &runtime_ok); break;
      case 4: layout = r.pick<int32_t>({2, -1, 99}); break;
      case 5: key.shape[1] = H + 1; break;
      case 6: value.shape[0] = nnz + 1; break;
      case 7: if (!fused) v.shape[r.range(0, 3)] += 1; else k.shape[1] = 3; break;
      default: backend = r.pick<int32_t>({MLACORE_BACKEND_AITER, 9}); runtime_ok = true; break;
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs;
  Tensor tk = make(k, r, fill_bytes(r)), tv = make(v, r, fill_bytes(r));
  Tensor tkey = make(key, r, fill_bytes(r)), tval = make(value, r, fill_bytes(r));
  for (Tensor* t : {&tk, &tv, &tkey, &tval}) {
    finalize(*t, r);
    bufs.push_back(t->buf);
  }
  materialize_append_index(r, a, P, S, bufs);
  snapshot(bufs);
  g_desc = std::string(nhd ? "NHD" : "HND") + (fused ? " fused" : " pair") + " P=" + std::to_string(P) + " S=" +
           std::to_string(S) + " H=" + std::to_string(H) + " D=" + std::to_string(D) + " nnz=" + std::to_string(nnz) +
           " strict=" + std::to_string(strict);
  if (!defect && strict && !all_tokens_valid(a, P, S, nnz)) defect = true;

  ++c.cases;
  const mlacore_status st =
      mlacore_append_paged_kv_cache(tkey.p(), tval.p(), a.tb.p(), a.tp.p(), tk.p(), tv.p(), a.ti.p(), a.tq.p(),
                                    a.tl.p(), layout, backend, strict, nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"append_key", "append_value", "batch_indices", "positions", "paged_kv_cache", "kv_indices",
                    "kv_indptr", "kv_last_page_len", "kv_layout", "backend", "(strict): token"})) {
    std::vector<CopyRef> copies;
    if (fused) {
      const int64_t f = 2;  // page, kv, then (S, H) or (H, S), D
      copies.push_back({&tkey, &tk, 0, nhd ? f : f + 1, nhd ? f + 1 : f, 0, H, D});
      copies.push_back({&tval, &tk, 0, nhd ? f : f + 1, nhd ? f + 1 : f, tk.stride(1), H, D});
    } else {
      copies.push_back({&tkey, &tk, 0, nhd ? 1 : 2, nhd ? 2 : 1, 0, H, D});
      copies.push_back({&tval, &tv, 0, nhd ? 1 : 2, nhd ? 2 : 1, 0, H, D});
    }
    apply_append_ref(a, P, S, copies, nnz);
  }
  check_buffers(bufs);
}

// =============================================================================
// plan build on host tensors
// =============================================================================

struct PlanHandle {
  mlacore_plan* p = nullptr;
  ~PlanHandle() { mlacore_plan_destroy(p); }
};

void fuzz_plan(Rng& r, Counter& c) {
  int64_t max_batch = r.range(0, 8), max_work = r.chance(0.5) ? 0 : max_batch + r.range(0, 20);
  int32_t num_sms = int32_t(r.range(1, 200));
  bool create_defect = false;
  if (r.chance(0.1)) {
    create_defect = true;
    switch (r.range(0, 3)) {
      case 0: max_batch = r.pick<int64_t>({-1, I64MIN, (int64_t(1) << 28) + 1, I64MAX}); break;
      case 1: max_work = max_batch >= 2 ? r.range(1, max_batch - 1) : (int64_t(1) << 28) + 1; break;
      case 2: num_sms = r.pick<int32_t>({0, -1, 65537, std::numeric_limits<int32_t>::min()}); break;
      default: max_work = r.pick<int64_t>({(int64_t(1) << 28) + 1, I64MAX}); break;
    }
  }
  g_desc = "max_batch=" + std::to_string(max_batch) + " max_work=" + std::to_string(max_work) +
           " num_sms=" + std::to_string(num_sms);
  PlanHandle h;
  ++c.cases;
  const mlacore_status cst = mlacore_plan_create(max_batch, max_work, num_sms, r.chance(0.02) ? nullptr : &h.p);
  if (cst == MLACORE_ERROR_TYPE && h.p == nullptr && std::strstr(mlacore_last_error(), "out") != nullptr) {
    ++c.errors;
    return;  // NULL out pointer
  }
  if (!check_status(c, cst, create_defect, false, {"max_batch", "max_work", "num_sms"})) {
    if (h.p != nullptr) fail("plan_create failed but returned a handle");
    return;
  }
  if (r.chance(0.1)) {  // the capacity helpers at extremes: no overflow (UBSan), sane answers
    const int64_t mbx = r.pick<int64_t>({I64MAX, I64MAX - 5, I64MIN, -1, 0, int64_t(1) << 28});
    const int32_t sms = int32_t(r.pick<int64_t>({I32MAX, 0, -1, 132}));
    const int64_t dw = mlacore_plan_default_max_work(mbx, sms);
    if (dw < std::max<int64_t>(mbx, 0)) fail("plan_default_max_work below max_batch");
    const int64_t sz = mlacore_plan_metadata_size(mbx, r.pick<int64_t>({I64MAX, -1, 1}));
    if (sz != -1 && (mbx < 0 || mbx > (int64_t(1) << 28))) fail("plan_metadata_size accepted an invalid capacity");
    int64_t offs[4] = {-7, -7, -7, -7};
    ++c.cases;
    const mlacore_status lst = mlacore_plan_layout(mbx, r.pick<int64_t>({I64MAX, -1, 1, mbx}), r.chance(0.2) ? nullptr : offs);
    if (lst != MLACORE_OK && !names_one_of(mlacore_last_error(), {"max_batch", "max_work", "offsets"}))
      fail(std::string("plan_layout error names no argument: ") + mlacore_last_error());
  }
  int64_t cap_batch = 0, cap_work = 0;
  mlacore_plan_capacity(h.p, &cap_batch, &cap_work, nullptr);
  if (cap_batch != max_batch || (max_work > 0 && cap_work != max_work)) fail("plan capacity differs from the request");
  const int64_t total = mlacore_plan_metadata_size(cap_batch, cap_work);

  const int64_t B = r.range(0, cap_batch);
  int32_t page_size = int32_t(r.pick<int64_t>({1, 3, 16, 64, 1024}));
  int32_t num_heads = int32_t(r.range(1, 128));
  TSpec qo = spec("qo_indptr", r.chance(0.5) ? I32 : I64, {B + 1}), kv = spec("kv_indptr", r.chance(0.5) ? I32 : I64, {B + 1});
  TSpec len = spec("kv_len_arr", r.chance(0.5) ? I32 : I64, {B});
  TSpec md = spec("metadata", I32, {total + (r.chance(0.3) ? r.range(1, 9) : 0)});
  for (TSpec* s : {&qo, &kv, &len}) layout1(*s, r, true);
  md.implicit_strides = r.chance(0.5);
  md.misalign = 0;
  // Values: consistent inputs, then one value defect at most.
  std::vector<int64_t> vq(static_cast<size_t>(B + 1)), vk(static_cast<size_t>(B + 1)), vl(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    vl[size_t(b)] = r.chance(0.1) ? 0 : r.range(0, r.chance(0.1) ? 5000 : 300);
    vq[size_t(b + 1)] = vq[size_t(b)] + r.range(0, 4);
    vk[size_t(b + 1)] = vk[size_t(b)] + (vl[size_t(b)] + page_size - 1) / page_size;
  }
  bool defect = false, runtime_ok = false;
  bool plan_null = false;
  if (r.chance(0.4)) {
    defect = true;
    const int64_t b = B > 0 ? r.range(0, B - 1) : 0;
    switch (r.range(0, 11)) {
      case 0: vq[0] = r.pick<int64_t>({1, -1, I32MAX}); break;
      case 1: vk[0] = r.pick<int64_t>({1, -1}); break;
      case 2: if (B > 0) vq[size_t(b + 1)] = vq[size_t(b)] - r.range(1, 3); else vq[0] = 5; break;
      case 3: if (B > 0) vl[size_t(b)] = r.pick<int64_t>({-1, I64MIN, I32MAX + int64_t(1)}); else vk[0] = 2; break;
      case 4: if (B > 0) vl[size_t(b)] += page_size * r.range(1, 3); else vq[0] = -3; break;
      case 5: page_size = int32_t(r.pick<int64_t>({0, -1, I32MIN})); break;
      case 6: num_heads = int32_t(r.pick<int64_t>({0, -5})); break;
      case 7: md.shape[0] = total - r.range(1, std::min<int64_t>(total, 8)); break;
      case 8: md.implicit_strides = false, md.strides[0] = 2; break;
      case 9: md.misalign = 4 * r.range(1, 3); break;
      case 10: {
        TSpec* all[] = {&qo, &kv, &len, &md};
        TSpec* s = all[r.range(0, 3)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &qo) s = &kv;
        if (d == Def::Dtype && s != &md) { s->dtype = bad_dtype(r, {I32, I64}); break; }
        if (d == Def::Ndim && s == &len && B == 0) d = Def::Null;
        apply_generic(*s, r, d, {s == &md ? I32 : I64, I32}, &runtime_ok);
        break;
      }
      default: plan_null = true; break;
    }
  }
  Tensor tq = make(qo, r, fill_bytes(r)), tk = make(kv, r, fill_bytes(r)), tl = make(len, r, fill_bytes(r));
  const std::pair<Tensor*, std::vector<int64_t>*> fills[] = {{&tq, &vq}, {&tk, &vk}, {&tl, &vl}};
  for (auto [t, v] : fills)
    if (is_index(t->s.dtype) && t->s.ndim == 1 && !t->s.null)
      for (int64_t i = 0; i < std::min<int64_t>(t->size(0), int64_t(v->size())); ++i) t->set(i, (*v)[size_t(i)]);
  Tensor tm = make(md, r, fill_bytes(r));
  for (Tensor* t : {&tq, &tk, &tl, &tm}) finalize(*t, r);
  // Reading back what the tensors hold decides validity for int32 inputs.
  if (!plan_null && page_size >= 1 && num_heads >= 1 && !md.null && md.ndim == 1 && md.shape[0] >= total &&
      md.misalign == 0 && (md.implicit_strides || md.strides[0] == 1) && same(md.dtype, I32) && md.device.device_type == kDLCPU) {
    bool ok = true;
    for (const Tensor* t : {&tq, &tk, &tl}) ok = ok && !t->s.null && t->s.ndim == 1 && is_index(t->s.dtype) && t->s.device.device_type == kDLCPU;
    ok = ok && tq.size(0) == B + 1 && tk.size(0) == B + 1 && tl.size(0) == B;
    if (ok) {
      ok = tq.rd(0) == 0 && tk.rd(0) == 0;
      for (int64_t b = 0; ok && b < B; ++b) {
        const int64_t q0 = tq.rd(b), q1 = tq.rd(b + 1), p0 = tk.rd(b), p1 = tk.rd(b + 1), l = tl.rd(b);
        ok = q1 >= q0 && q1 <= I32MAX && p1 >= p0 && p1 <= I32MAX && l >= 0 && l <= I32MAX &&
             (l + page_size - 1) / page_size == p1 - p0;
      }
      // Validity is what the tensors hold: a value beyond int32 wraps in an
      // int32 input, and a broadcast (stride 0) input repeats one value.
      defect = !ok;
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs = {tq.buf, tk.buf, tl.buf, tm.buf};
  snapshot(bufs);
  g_desc += " B=" + std::to_string(B) + " page_size=" + std::to_string(page_size) + " heads=" + std::to_string(num_heads);

  ++c.cases;
  const mlacore_status st =
      mlacore_plan_build(plan_null ? nullptr : h.p, tq.p(), tk.p(), tl.p(), page_size, num_heads, tm.p(), nullptr);
  if (check_status(c, st, defect, runtime_ok,
                   {"plan", "qo_indptr", "kv_indptr", "kv_len_arr", "page_size", "num_heads", "metadata"})) {
    // Schedule invariants (decode_schedule.h, plan.h) against the inputs.
    const int32_t* m = reinterpret_cast<const int32_t*>(&tm.buf->bytes[size_t(tm.origin)]);
    int64_t off[4];
    mlacore_plan_layout(cap_batch, cap_work, off);
    const int32_t num_work = m[0], num_partials = m[1];
    int64_t max_qo = 0, max_kv = 0;
    for (int64_t b = 0; b < B; ++b) max_qo = std::max(max_qo, tq.rd(b + 1) - tq.rd(b)), max_kv = std::max(max_kv, tl.rd(b));
    const int32_t chunk = m[5];
    if (m[2] != B || m[3] != max_qo || m[4] != max_kv || m[6] != tq.rd(B) || m[7] != 0 || num_work < 0 ||
        num_work > cap_work || num_partials < 0 || chunk <= 0 || chunk % 64 != 0)
      fail("plan header wrong");
    mlacore_plan_info info{};
    mlacore_plan_get_info(h.p, &info);
    if (info.batch != m[2] || info.num_work != num_work || info.num_partials != num_partials || info.on_host != 1)
      fail("plan info differs from the header");
    const int32_t* lpl = m + off[1];
    const int32_t* split = m + off[2];
    const int32_t* items = m + off[3];
    int64_t w = 0, partials = 0;
    for (int64_t b = 0; b < B && w <= num_work; ++b) {
      const int64_t l = tl.rd(b), pages = tk.rd(b + 1) - tk.rd(b);
      if (lpl[b] != (l == 0 ? 0 : l - (pages - 1) * page_size)) fail("kv_last_page_len wrong at " + std::to_string(b));
      if (split[b] != partials) fail("split_indptr wrong at " + std::to_string(b));
      int64_t pos = 0, n = 0;
      const int64_t first = w;
      while (w < num_work && items[4 * w] == b) {
        if (items[4 * w + 1] != pos || items[4 * w + 2] < pos || items[4 * w + 2] - pos > chunk) fail("work item range wrong");
        pos = items[4 * w + 2];
        ++n;
        ++w;
      }
      if (pos != l || n == 0) fail("request " + std::to_string(b) + " not covered: got " + std::to_string(pos) + " of " + std::to_string(l));
      for (int64_t i = 0; i < n; ++i)
        if (items[4 * (first + i) + 3] != (n > 1 ? partials + i : -1)) fail("partial index wrong");
      if (n > 1) partials += n;
    }
    if (w != num_work || partials != num_partials) fail("work items do not match the header");
    for (int64_t b = B; b < cap_batch; ++b)
      if (lpl[b] != 0) fail("kv_last_page_len padding not 0");
    for (int64_t b = B; b <= cap_batch; ++b)
      if (split[b] != num_partials) fail("split_indptr padding wrong");
    for (int64_t i = num_work; i < cap_work; ++i)
      if (items[4 * i] != -1 || items[4 * i + 3] != -1) fail("padding work item wrong");
    // The schedule region is the target; anything past total() is not.
    std::memcpy(&tm.buf->expect[size_t(tm.origin)], &tm.buf->bytes[size_t(tm.origin)], size_t(total * 4));
  } else if (!md.null && md.ndim == 1 && md.shape[0] >= total && tm.isz == 4 && (md.implicit_strides || md.strides[0] == 1)) {
    // After a failure the metadata contents are unspecified, nothing else.
    std::memcpy(&tm.buf->expect[size_t(tm.origin)], &tm.buf->bytes[size_t(tm.origin)], size_t(total * 4));
  }
  check_buffers(bufs);
}

// =============================================================================
// MLA decode on tiny CPU shapes
// =============================================================================

float half_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0) v = std::ldexp(float(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(float(man | 1024), int(exp) - 25);
  return sign ? -v : v;
}

uint16_t float_to_half_bits(float f, bool bf16) {
  if (bf16) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  // Small values in [-1, 1] only: normal fp16 with round-to-nearest.
  const uint32_t sign = f < 0 ? 0x8000u : 0u;
  float a = std::fabs(f);
  if (a < 6.2e-5f) return uint16_t(sign);
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const uint32_t man = uint32_t(std::lround((m * 2 - 1) * 1024));
  return uint16_t(sign | (uint32_t(e - 1 + 15) << 10) | std::min<uint32_t>(man, 1023));
}

void fuzz_decode(Rng& r, Counter& c) {
  const bool bf16 = r.chance(0.5);
  const DLDataType dt = bf16 ? BF16 : F16;
  const int64_t H = r.range(1, 3), B = r.range(0, 3), S = r.pick<int64_t>({1, 3, 16, 64});
  std::vector<int64_t> qo(static_cast<size_t>(B + 1)), kvp(static_cast<size_t>(B + 1)), lens(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    lens[size_t(b)] = r.chance(0.2) ? 0 : r.range(1, 140);
    qo[size_t(b + 1)] = qo[size_t(b)] + r.range(0, 2);
    kvp[size_t(b + 1)] = kvp[size_t(b)] + (lens[size_t(b)] + S - 1) / S;
  }
  const int64_t total_q = qo[size_t(B)] + (r.chance(0.2) ? r.range(1, 2) : 0);  // rows no request covers
  const int64_t num_idx = kvp[size_t(B)], P = std::max<int64_t>(1, num_idx / 2 + r.range(0, 3));
  const DLDataType idt = r.chance(0.5) ? I32 : I64;
  const bool causal = r.chance(0.5);
  const float scale = float(r.pick<double>({0.0416, 0.1, 1.0}));

  // Plan: a real schedule from the plan builder.
  PlanHandle h;
  if (mlacore_plan_create(std::max<int64_t>(B, 1) + r.range(0, 2), 0, int32_t(r.range(1, 8)), &h.p) != MLACORE_OK) {
    fail(std::string("plan_create: ") + mlacore_last_error());
    return;
  }
  int64_t mb = 0, mw = 0;
  mlacore_plan_capacity(h.p, &mb, &mw, nullptr);
  TSpec tqo = spec("qo_indptr", idt, {B + 1}), tkvp = spec("kv_indptr", idt, {B + 1}), tlen = spec("kv_len", idt, {B});
  TSpec tidx = spec("kv_indices", idt, {num_idx});
  for (TSpec* s : {&tqo, &tkvp, &tlen, &tidx}) layout1(*s, r, true);
  for (TSpec* s : {&tqo, &tkvp, &tlen})  // distinct values: no broadcast
    if (s->strides[0] == 0) s->strides[0] = 2;
  Tensor iq = make(tqo, r, fill_bytes(r)), ik = make(tkvp, r, fill_bytes(r)), il = make(tlen, r, fill_bytes(r));
  for (int64_t i = 0; i <= B; ++i) iq.set(i, qo[size_t(i)]), ik.set(i, kvp[size_t(i)]);
  for (int64_t i = 0; i < B; ++i) il.set(i, lens[size_t(i)]);
  Tensor ii = make(tidx, r, fill_index(r, P, P));
  TSpec md = spec("metadata", I32, {mlacore_plan_metadata_size(mb, mw)});
  Tensor tm = make(md, r, fill_bytes(r));
  for (Tensor* t : {&iq, &ik, &il, &ii, &tm}) finalize(*t, r);
  if (mlacore_plan_build(h.p, iq.p(), ik.p(), il.p(), int32_t(S), int32_t(H), tm.p(), nullptr) != MLACORE_OK) {
    fail(std::string("plan_build: ") + mlacore_last_error());
    return;
  }
  mlacore_plan_info info{};
  mlacore_plan_get_info(h.p, &info);
  mlacore_decode_dims dims{mb, mw, std::max<int64_t>(info.max_qo_len, 1) + (r.chance(0.2) ? 1 : 0),
                           r.chance(0.5) ? mw : r.range(std::max<int32_t>(info.num_partials, 1), mw)};
  bool garbage = r.chance(0.1);  // a random schedule: only safety is checked
  // qo_indptr / kv_len changed after planning (int32 or int64 extremes): only safety.
  const bool tables_changed = r.chance(0.08);
  if (tables_changed) {
    garbage = true;
    const int64_t v = r.pick<int64_t>({I64MIN, I64MAX, I32MIN, I32MAX, -1, total_q + 3});
    if (r.chance(0.5)) iq.set(r.range(0, B), v);
    else if (B > 0) il.set(r.range(0, B - 1), r.pick<int64_t>({I64MIN, I32MIN, -1, 0, 1000}));
  }
  if (garbage) {
    int32_t* m = reinterpret_cast<int32_t*>(&tm.buf->bytes[size_t(tm.origin)]);
    for (int64_t i = 0; i < md.shape[0]; ++i)
      if (r.chance(0.3)) m[i] = int32_t(r.chance(0.5) ? r.range(-3, 200) : int64_t(r.next()));
  }

  // Tensors.
  TSpec qn = spec("q_nope", dt, {total_q, H, 512}), qp = spec("q_pe", dt, {total_q, H, 64});
  TSpec ckv = spec("ckv_cache", dt, {P, S, 512}), kpe = spec("kpe_cache", dt, {P, S, 64});
  TSpec out = spec("out", dt, {total_q, H, 512}), lse = spec("lse", F32, {total_q, H});
  TSpec ws = spec("workspace", U8, {mlacore_mla_decode_workspace_bytes(dims, H) + (r.chance(0.3) ? 64 : 0)});
  for (TSpec* s : {&qn, &qp, &out}) layoutN(*s, r, true);
  layoutN(lse, r, false);
  for (TSpec* s : {&qn, &qp, &out, &lse})  // outputs and queries: distinct elements
    for (int d = 0; d < s->ndim; ++d)
      if (!s->implicit_strides && s->strides[d] == 0) s->strides[d] = 1, s->implicit_strides = true;
  const bool shared = r.chance(0.5);
  bool defect = false, runtime_ok = false, lse_null = r.chance(0.2);
  uint32_t flags = causal ? MLACORE_DECODE_CAUSAL : 0u;
  float sm = scale;
  int64_t page_size_arg = S;
  if (r.chance(0.35)) {
    defect = true;
    const int64_t kind = r.range(0, 12);
    g_desc = "defect " + std::to_string(kind);
    switch (kind) {
      case 0: case 1: {
        TSpec* all[] = {&qn, &qp, &out, &lse, &ws};
        TSpec* s = all[r.range(0, 4)];
        Def d = random_generic(r);
        if (d == Def::Device && s == &qn) s = &qp;
        if (s == &lse && d == Def::Null) lse_null = false, d = Def::Dtype;
        if (s == &ws && (d == Def::Ndim || d == Def::Dtype)) d = Def::Null;  // any shape/dtype of enough bytes is fine
        if (s == &lse) lse_null = false;
        apply_generic(*s, r, d, {s == &lse ? F32 : dt}, &runtime_ok);
        break;
      }
      case 2: qn.shape[1] = r.pick<int64_t>({0, 129}), qp.shape[1] = qn.shape[1], out.shape[1] = qn.shape[1], lse.shape[1] = qn.shape[1]; break;
      case 3: qp.shape[2] = 32; break;
      case 4: page_size_arg = r.pick<int64_t>({0, -1, S + 1}); break;
      case 5: kpe.shape[0] = P + 1; break;
      case 6:
        if (r.chance(0.5)) dims.max_work = r.pick<int64_t>({0, -1});
        else dims.max_partials = r.pick<int64_t>({0, -1, mw + 1, I64MAX});
        break;
      case 7: ws.shape[0] = std::max<int64_t>(0, ws.shape[0] - r.range(1, 64) - (ws.shape[0] > mlacore_mla_decode_workspace_bytes(dims, H) ? 64 : 0)); if (mlacore_mla_decode_workspace_bytes(dims, H) == 0) ws.misalign = 4; break;
      case 8: flags |= 4u << r.range(0, 4); break;
      case 9: sm = r.chance(0.5) ? NAN : INFINITY; break;
      case 10: out.shape[0] = total_q + 1; break;
      case 11: lse_null = false, lse.dtype = F16; break;
      default: dims.max_batch = mb + 2; break;  // metadata length no longer matches
    }
  }
  std::vector<std::shared_ptr<Buf>> bufs = {iq.buf, ik.buf, il.buf, ii.buf, tm.buf};
  auto fill_val = [&](Tensor& t, int64_t b) {
    const uint16_t v = float_to_half_bits(float(r.range(-1000, 1000)) / 1000.f, bf16);
    // A dtype defect may have made the elements 1 byte wide: never write past one.
    std::memcpy(&t.buf->bytes[size_t(b)], &v, size_t(std::min<int64_t>(2, t.isz)));
  };
  Tensor tqn = make(qn, r, fill_val), tqp = make(qp, r, fill_val);
  Tensor tc, tk;
  if (shared) {
    TSpec ps = spec("parent", dt, {P, S, 576 + (r.chance(0.3) ? 8 : 0)});
    Tensor tpar = make(ps, r, fill_val);
    ckv.strides[0] = kpe.strides[0] = ps.strides[0];
    ckv.strides[1] = kpe.strides[1] = ps.strides[1];
    ckv.strides[2] = kpe.strides[2] = 1;
    tc = view(ckv, tpar.buf, tpar.origin);
    tk = view(kpe, tpar.buf, tpar.origin + 512 * 2);
    bufs.push_back(tpar.buf);
  } else {
    layoutN(ckv, r, true);
    layoutN(kpe, r, true);
    tc = make(ckv, r, fill_val);
    tk = make(kpe, r, fill_val);
    bufs.push_back(tc.buf);
    bufs.push_back(tk.buf);
  }
  Tensor to = make(out, r, fill_bytes(r)), tl = make(lse, r, fill_bytes(r)), tw = make(ws, r, fill_bytes(r));
  if (lse_null) tl.s.null = true;
  for (Tensor* t : {&tqn, &tqp, &tc, &tk, &to, &tl, &tw}) finalize(*t, r);
  for (Tensor* t : {&tqn, &tqp, &to, &tl, &tw}) bufs.push_back(t->buf);
  snapshot(bufs);
  g_desc += " B=" + std::to_string(B) + " H=" + std::to_string(H) + " S=" + std::to_string(S) + " P=" + std::to_string(P) +
           " total_q=" + std::to_string(total_q) + (bf16 ? " bf16" : " fp16") + (causal ? " causal" : "") +
           (garbage ? " garbage-schedule" : "") + (shared ? " shared" : " separate");

  ++c.cases;
  const mlacore_status st = mlacore_mla_decode(tqn.p(), tqp.p(), tc.p(), tk.p(), ii.p(), ik.p(), iq.p(), il.p(), tm.p(),
                                               tw.p(), to.p(), tl.p(), dims, page_size_arg, sm, flags, nullptr);
  if (std::getenv("MLACORE_FUZZ_VERBOSE")) {
    const int32_t* m = reinterpret_cast<const int32_t*>(&tm.buf->bytes[size_t(tm.origin)]);
    int64_t off[4];
    mlacore_plan_layout(mb, mw, off);
    std::fprintf(stderr, "dims %lld %lld %lld hdr", (long long)dims.max_batch, (long long)dims.max_work, (long long)dims.max_qo_len);
    for (int i = 0; i < 8; ++i) std::fprintf(stderr, " %d", m[i]);
    std::fprintf(stderr, "\nitems:");
    for (int64_t w = 0; w < mw; ++w) std::fprintf(stderr, " (%d %d %d %d)", m[off[3] + 4 * w], m[off[3] + 4 * w + 1], m[off[3] + 4 * w + 2], m[off[3] + 4 * w + 3]);
    std::fprintf(stderr, "\nsplit:");
    for (int64_t b = 0; b <= mb; ++b) std::fprintf(stderr, " %d", m[off[2] + b]);
    std::fprintf(stderr, "\nqo/kvp/len:");
    for (int64_t b = 0; b < B; ++b) std::fprintf(stderr, " [%lld %lld %lld]", (long long)iq.rd(b), (long long)ik.rd(b), (long long)il.rd(b));
    std::fprintf(stderr, "\nidx:");
    for (int64_t i = 0; i < num_idx; ++i) std::fprintf(stderr, " %lld", (long long)ii.rd(i));
    std::fprintf(stderr, "\ndefect %d status %d %s\n", int(defect), int(st), mlacore_last_error());
    for (const Tensor* t : {&iq, &ik, &il, &ii, &tqn, &tqp, &tc, &tk, &to, &tl, &tw}) {
      std::fprintf(stderr, "  %s ndim %d null %d impl %d:", t->s.name, t->s.ndim, int(t->s.null), int(t->s.implicit_strides));
      for (int d = 0; d < t->dims(); ++d) std::fprintf(stderr, " %lld/%lld", (long long)t->s.shape[d], (long long)t->stride(d));
      std::fprintf(stderr, "\n");
    }
  }
  const bool ok = check_status(c, st, defect, runtime_ok,
                               {"q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indices", "kv_indptr", "qo_indptr",
                                "kv_len", "metadata", "workspace", "out", "lse", "dims", "page_size", "flags", "sm_scale"});
  if (ok) {
    // Targets: the workspace, and out/lse rows of query tokens some request
    // covers (qo_indptr decides, whatever the schedule says). Everything else
    // must keep its bytes.
    std::vector<char> covered(size_t(total_q), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = qo[size_t(b)]; t < qo[size_t(b + 1)]; ++t) covered[size_t(t)] = 1;
    if (tables_changed) std::fill(covered.begin(), covered.end(), char(1));
    for (int64_t i = 0; i < ws.shape[0]; ++i) tw.buf->expect[size_t(tw.at(i))] = tw.buf->bytes[size_t(tw.at(i))];
    for (int64_t t = 0; t < total_q; ++t)
      for (int64_t hh = 0; hh < H && covered[size_t(t)]; ++hh) {
        const int64_t o = to.at(t * to.stride(0) + hh * to.stride(1));
        std::memcpy(&to.buf->expect[size_t(o)], &to.buf->bytes[size_t(o)], size_t(512 * 2));
        if (!tl.s.null) {
          const int64_t lo = tl.at(t * tl.stride(0) + hh * tl.stride(1));
          std::memcpy(&tl.buf->expect[size_t(lo)], &tl.buf->bytes[size_t(lo)], 4);
        }
      }
    if (!garbage) {
      // Reference attention in double for every covered row.
      static std::vector<float> lut[2];  // 16-bit pattern -> float, per dtype
      if (lut[bf16].empty()) {
        lut[bf16].resize(65536);
        for (uint32_t v = 0; v < 65536; ++v) lut[bf16][v] = half_to_float(uint16_t(v), bf16);
      }
      const float* table = lut[bf16].data();
      auto ld = [&](const Tensor& t, int64_t el) {
        uint16_t v;
        std::memcpy(&v, &t.buf->bytes[size_t(t.at(el))], 2);
        return double(table[v]);
      };
      for (int64_t b = 0; b < B; ++b) {
        const int64_t q0 = qo[size_t(b)], ql = qo[size_t(b + 1)] - q0, L = lens[size_t(b)];
        for (int64_t t = 0; t < ql; ++t)
          for (int64_t hh = 0; hh < H; ++hh) {
            std::vector<double> sc;
            std::vector<int64_t> rows_c;
            const int64_t qrow_n = (q0 + t) * tqn.stride(0) + hh * tqn.stride(1);
            const int64_t qrow_p = (q0 + t) * tqp.stride(0) + hh * tqp.stride(1);
            for (int64_t p = 0; p < L; ++p) {
              if (causal && p >= L - ql + t + 1) continue;
              const int64_t slot = ref_slot(ii, ik, B, S, P, b, p);
              if (slot < 0) continue;  // masked: bad page id
              const int64_t pg = slot / S, off = slot % S;
              double acc = 0;
              for (int d = 0; d < 512; ++d) acc += ld(tqn, qrow_n + d) * ld(tc, pg * tc.stride(0) + off * tc.stride(1) + d);
              for (int d = 0; d < 64; ++d) acc += ld(tqp, qrow_p + d) * ld(tk, pg * tk.stride(0) + off * tk.stride(1) + d);
              sc.push_back(acc * sm);
              rows_c.push_back(pg * tc.stride(0) + off * tc.stride(1));
            }
            double mx = -INFINITY, sum = 0, worst = 0;
            for (double s : sc) mx = std::max(mx, s);
            std::vector<double> wgt(sc.size());
            for (size_t j = 0; j < sc.size(); ++j) sum += (wgt[j] = std::exp(sc[j] - mx));
            const int64_t obase = (q0 + t) * to.stride(0) + hh * to.stride(1);
            for (int d = 0; d < 512; ++d) {
              double o = 0;
              for (size_t j = 0; j < sc.size(); ++j) o += wgt[j] / sum * ld(tc, rows_c[j] + d);
              const double got = ld(to, obase + d);
              worst = std::max(worst, sc.empty() && got != 0 ? 1e9 : std::fabs(got - o));
            }
            const double tol = bf16 ? 2e-2 : 4e-3;
            if (!(worst <= tol))
              fail("decode output off by " + std::to_string(worst) + " (request " + std::to_string(b) + ", row " +
                   std::to_string(t) + ", head " + std::to_string(hh) + ")");
            if (!tl.s.null) {
              float got;
              std::memcpy(&got, &tl.buf->bytes[size_t(tl.at((q0 + t) * tl.stride(0) + hh * tl.stride(1)))], 4);
              const double want = sc.empty() ? -INFINITY : (mx + std::log(sum)) / std::log(2.0);
              if (sc.empty() ? !(std::isinf(got) && got < 0) : !(std::fabs(got - want) <= 1e-3 * (1 + std::fabs(want))))
                fail("decode lse " + std::to_string(got) + ", want " + std::to_string(want));
            }
          }
      }
    }
  }
  check_buffers(bufs);
}

// =============================================================================
// driver
// =============================================================================

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
