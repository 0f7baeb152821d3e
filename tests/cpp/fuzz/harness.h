// The fuzz driver's harness: seeded randomness, failure reporting, dtypes,
// tensors in guarded buffers, layouts, index values, the call checks, the
// generic defects and the reference slot. The driver (driver.cpp) and one
// file per entry point (ops.h) build on it; see driver.cpp for what a case is.
#pragma once

#include <mlacore/mlacore.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace fuzz {

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

uint64_t mix(uint64_t a, uint64_t b);

// ---- failure reporting ----------------------------------------------------------

extern int g_failures;
extern uint64_t g_seed;
extern const char* g_entry;
extern int64_t g_case;
extern std::string g_desc;  // what the current case is, for failure messages

void fail(const std::string& what);

// ---- dtypes ---------------------------------------------------------------------

const DLDataType I32{kDLInt, 32, 1}, I64{kDLInt, 64, 1}, U8{kDLUInt, 8, 1};
const DLDataType F16{kDLFloat, 16, 1}, BF16{kDLBfloat, 16, 1}, F32{kDLFloat, 32, 1};

bool same(const DLDataType& a, const DLDataType& b);

// A dtype that none of `allowed` is, drawn from valid-looking and malformed ones.
DLDataType bad_dtype(Rng& r, std::initializer_list<DLDataType> allowed);

int64_t item_bytes(const DLDataType& d);

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
  // Hostile defects, applied to the DLTensor only (finalize): the buffer and
  // every access of the driver keep the spec's small layout.
  bool null_data = false;  // DLTensor.data = NULL
  int npatch = 0;          // dims whose size and stride the DLTensor replaces
  int patch_dim[2] = {};
  int64_t patch_size[2] = {}, patch_stride[2] = {};
};

struct Tensor {
  TSpec s;
  DLTensor dl{};
  std::shared_ptr<Buf> buf;
  int64_t origin = 0;  // byte index of element 0 in buf->bytes
  int64_t isz = 1;
  int64_t dl_shape[9] = {}, dl_strides[9] = {};  // what the DLTensor says when the spec is hostile

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
bool span_of(const TSpec& s, const Tensor& t, int64_t& lo, int64_t& hi);

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
Tensor view(const TSpec& s, const std::shared_ptr<Buf>& buf, int64_t origin);

// Fills the DLTensor once the spec is final; data/byte_offset split at random.
void finalize(Tensor& t, Rng& r);

void fill_random_bytes(Rng& r, Tensor& t, int64_t b);

// ---- layouts ----------------------------------------------------------------------

TSpec spec(const char* name, DLDataType dtype, std::initializer_list<int64_t> shape);

// 1-D: unit, strided, reversed or broadcast (stride 0).
void layout1(TSpec& s, Rng& r, bool allow_negative);

// N-D: compact (implicit or explicit), padded, permuted (transposed), with a
// broadcast or a reversed dim. `last_contig` keeps the last dim at stride 1.
void layoutN(TSpec& s, Rng& r, bool last_contig);

// ---- index values ----------------------------------------------------------------

// An index value: mostly in [0, hi), sometimes just outside, sometimes extreme.
int64_t index_value(Rng& r, int64_t hi, int64_t extra_special = -1);

// ---- call checking -------------------------------------------------------------------

struct Counter {
  const char* name;
  int64_t cases = 0, ok = 0, errors = 0;
  double seconds = 0;
};

bool names_one_of(const char* msg, std::initializer_list<const char*> names);

// Checks the status against the case kind. Returns true when the call
// succeeded (the caller then compares results).
bool check_status(Counter& c, mlacore_status st, bool defect, bool runtime_ok,
                  std::initializer_list<const char*> names);

// Guards intact and every buffer equal to its expected image.
void check_buffers(const std::vector<std::shared_ptr<Buf>>& bufs);

void snapshot(const std::vector<std::shared_ptr<Buf>>& bufs);

// ---- defects applied to a spec -------------------------------------------------------

enum class Def { None, Null, Ndim, Dtype, Device, Malformed, Hostile };

// Applies one generic defect to `s`; `allowed` are the dtypes it may have.
// Returns true when the defect makes the call invalid for sure, false when
// it turned out harmless (the caller then treats the case as clean).
bool apply_generic(TSpec& s, Rng& r, Def d, std::initializer_list<DLDataType> allowed, bool* runtime_ok);

// Def::Hostile: sizes near INT64_MAX / INT32_MAX through stride 0 (no memory
// behind them), strides whose byte span leaves int64, or NULL data under a
// non-empty shape; always invalid (a tensor without elements gets NULL).
void apply_hostile(TSpec& s, Rng& r);

Def random_generic(Rng& r);

// ---- reference semantics --------------------------------------------------------------

// The slot of (b, pos) per slot_mapping.h / page_table.h: -1 when the batch
// index, the indptr range, the position or the page id is out of range. With
// num_pages < 0 a page id must keep every slot of its page within int64.
int64_t ref_slot(const Tensor& idx, const Tensor& ptr, int64_t batch, int64_t page_size, int64_t num_pages,
                 int64_t b, int64_t pos);

// A monotone indptr of n+1 entries within [0, limit], then sometimes corrupted.
void fill_indptr(Rng& r, const Tensor& t, int64_t n, int64_t limit, double corrupt);

// Fill helpers for index tensors of either width.
inline auto fill_index(Rng& r, int64_t hi, int64_t special = -1) {
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

inline auto fill_bytes(Rng& r) {
  return [&r](Tensor& t, int64_t b) { fill_random_bytes(r, t, b); };
}

bool is_index(const DLDataType& d);

// A plan destroyed at scope exit (plan and decode cases).
struct PlanHandle {
  mlacore_plan* p = nullptr;
  ~PlanHandle() { mlacore_plan_destroy(p); }
};

}  // namespace fuzz
