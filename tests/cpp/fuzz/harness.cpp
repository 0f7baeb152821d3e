// Definitions of the fuzz harness (harness.h).
#include "harness.h"

namespace fuzz {

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0x9e3779b97f4a7c15ull));
  r.next();
  return r.next();
}

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

bool same(const DLDataType& a, const DLDataType& b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

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

Tensor view(const TSpec& s, const std::shared_ptr<Buf>& buf, int64_t origin) {
  Tensor t;
  t.s = s;
  t.isz = item_bytes(s.dtype);
  t.buf = buf;
  t.origin = origin;
  return t;
}

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
  if (t.s.npatch > 0) {
    for (int d = 0; d < t.dims(); ++d) {
      t.dl_shape[d] = t.s.shape[d];
      t.dl_strides[d] = t.stride(d);
    }
    for (int k = 0; k < t.s.npatch; ++k) {
      t.dl_shape[t.s.patch_dim[k]] = t.s.patch_size[k];
      t.dl_strides[t.s.patch_dim[k]] = t.s.patch_stride[k];
    }
    t.dl.shape = t.dl_shape;
    t.dl.strides = t.dl_strides;
  }
  if (t.s.null_data) {
    t.dl.data = nullptr;
    t.dl.byte_offset = 0;
  }
}

void apply_hostile(TSpec& s, Rng& r) {
  const int n = s.ndim;
  __int128 numel = 1;
  for (int d = 0; d < n && d < 9; ++d) numel *= s.shape[d];
  if (numel <= 0) {  // empty: huge sizes in place of its zeros, and no data
    for (int d = 0; d < n && d < 9; ++d)
      if (s.shape[d] == 0) {
        if (s.npatch == 2) {
          s.null = true;
          return;
        }
        s.patch_dim[s.npatch] = d, s.patch_size[s.npatch] = r.pick<int64_t>({I64MAX, I32MAX, int64_t(1) << 62, 1});
        s.patch_stride[s.npatch++] = 0;
      }
    if (s.npatch == 0) s.null = true;  // no dims (ndim 0 with a zero numel cannot happen) or malformed
    s.null_data = true;
    return;
  }
  const int64_t item = item_bytes(s.dtype);
  const __int128 limit = I64MAX;
  const int kind = int(r.range(0, 2));
  if (kind == 0) {
    s.null_data = true;
    return;
  }
  auto stride_of = [&](int d) {  // the spec's element stride (implicit: compact)
    if (!s.implicit_strides) return s.strides[d];
    int64_t st = 1;
    for (int i = n - 1; i > d; --i) st *= s.shape[i];
    return st;
  };
  if (kind == 1) {  // huge sizes at stride 0
    const int d = int(r.range(0, n - 1));
    const int64_t v = r.pick<int64_t>({I64MAX, I64MAX - 1, int64_t(1) << 62, (int64_t(1) << 62) + (int64_t(1) << 40),
                                       item > 1 ? I64MAX / item + 1 : I64MAX, I32MAX, I32MAX + 1, int64_t(1) << 32});
    // Saturating at 2^100 (far past int64) keeps the driver's own arithmetic defined.
    auto sat = [](__int128 a, __int128 b) {
      const __int128 cap = (__int128)1 << 100;
      return a > 0 && b > cap / a ? cap : a * b;
    };
    __int128 total = sat(numel / s.shape[d], v);
    s.patch_dim[0] = d, s.patch_size[0] = v, s.patch_stride[0] = 0, s.npatch = 1;
    if (n >= 2 && r.chance(0.5)) {
      const int d2 = (d + 1 + int(r.range(0, n - 2))) % n;
      const int64_t v2 = r.pick<int64_t>({I32MAX, I32MAX + 1, int64_t(1) << 32, int64_t(1) << 62});
      total = sat(total / s.shape[d2], v2);
      s.patch_dim[1] = d2, s.patch_size[1] = v2, s.patch_stride[1] = 0, s.npatch = 2;
    }
    if (sat(total, item) <= limit) s.null_data = true;  // a size that fits: refused for its NULL data instead
    return;
  }
  int d = -1;  // huge stride on a dim of at least 2 elements
  for (int i = 0; i < n; ++i)
    if (s.shape[i] >= 2 && (d < 0 || r.chance(0.5))) d = i;
  if (d < 0) {
    s.null_data = true;
    return;
  }
  const int64_t just_past = (I64MAX / item) / (s.shape[d] - 1);  // + 1: the span no longer fits
  const int64_t st = r.pick<int64_t>({I64MAX, I64MIN, I64MAX / 2, -(I64MAX / 2), I64MAX / item,
                                      just_past < I64MAX ? just_past + 1 : I64MAX});
  const __int128 mag = st < 0 ? -(__int128)st : (__int128)st;
  __int128 span = (__int128)(s.shape[d] - 1) * mag * item;
  for (int i = 0; i < n; ++i)
    if (i != d) span += (__int128)(s.shape[i] - 1) * (stride_of(i) < 0 ? -stride_of(i) : stride_of(i)) * item;
  s.patch_dim[0] = d, s.patch_size[0] = s.shape[d], s.patch_stride[0] = st, s.npatch = 1;
  if (span <= limit) s.null_data = true;
}

void fill_random_bytes(Rng& r, Tensor& t, int64_t b) {
  for (int64_t i = 0; i < t.isz; ++i) t.buf->bytes[size_t(b + i)] = uint8_t(r.next());
}

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

void layout1(TSpec& s, Rng& r, bool allow_negative) {
  const int k = int(r.range(0, 9));
  s.implicit_strides = k == 0;
  const int64_t options[] = {1, 1, 2, 3, 7, 0, -1, -2, 1, 1};
  int64_t st = options[k];
  if (st < 0 && !allow_negative) st = -st;
  s.strides[0] = st;
}

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

int64_t index_value(Rng& r, int64_t hi, int64_t extra_special) {
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

bool names_one_of(const char* msg, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (std::strstr(msg, n) != nullptr) return true;
  return false;
}

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
    case Def::Hostile:
      apply_hostile(s, r);
      return true;
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

Def random_generic(Rng& r) { return Def(r.range(1, 6)); }

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

bool is_index(const DLDataType& d) { return same(d, I32) || same(d, I64); }

}  // namespace fuzz
