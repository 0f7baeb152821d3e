#include "backends/aiter/aiter_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>

namespace mlacore {
namespace {

// The hand-over path and whether the probe has begun share one mutex, so a
// path set concurrently with the first probe either counts or is refused:
// never silently ignored.
std::mutex g_path_mutex;
std::string g_handed_path;
bool g_probe_started = false;

const char* env_library() {
  const char* env = std::getenv("MLACORE_AITER_LIB");
  // Empty counts as unset: `MLACORE_AITER_LIB= cmd` is the usual way to
  // switch an inherited setting off.
  return env != nullptr && env[0] != '\0' ? env : nullptr;
}

const char* no_library_reason() {
#if defined(MLACORE_WITH_HIP)
  return "no AITER library: MLACORE_AITER_LIB is unset and no installed aiter package was handed over "
         "(the Python layer looks for aiter/jit/module_mla_asm.so)";
#else
  return "no AITER library: MLACORE_AITER_LIB is unset and no installed aiter package was handed over "
         "(and this libmlacore is not a HIP build, so native kernels run)";
#endif
}

void load(AiterLibrary& lib) {
  std::string label;
  {
    std::lock_guard<std::mutex> lock(g_path_mutex);
    g_probe_started = true;
    if (const char* env = env_library()) {
      lib.path = env;
      label = "MLACORE_AITER_LIB=" + lib.path;
    } else if (!g_handed_path.empty()) {
      lib.path = g_handed_path;
      label = "aiter package library " + lib.path;
    }
  }
  if (lib.path.empty()) {
    lib.reason = no_library_reason();
    return;
  }

  // RTLD_NOW: a library with unresolved symbols fails here, in the probe,
  // not at its first call. RTLD_LOCAL: AITER's symbols never interpose on
  // the process's other copies (torch's, a second AITER's).
  void* handle = dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    lib.reason = label + ": dlopen failed: " + (err != nullptr ? err : "unknown error");
    return;
  }
  // From here failures keep the handle open: a library linked against the
  // HIP runtime may have started threads, and unloading it under them is a
  // known crash; a leaked RTLD_LOCAL handle costs nothing.

  // The version first: until it is known, no other symbol's signature can be
  // trusted, so nothing else is called.
  dlerror();
  auto version = reinterpret_cast<aiter_c_abi_version_fn>(dlsym(handle, MLACORE_AITER_VERSION_SYMBOL));
  if (version == nullptr) {
    lib.reason = label + ": lacks symbol " MLACORE_AITER_VERSION_SYMBOL
                         " (mlacore calls only libraries that state their C ABI version; released AITER "
                         "builds do not export it yet, see docs/AITER.md)";
    return;
  }
  lib.abi_version = version();
  if (lib.abi_version != kAiterKnownAbiVersion) {
    std::ostringstream msg;
    msg << label << ": ABI version " << lib.abi_version << " is not one mlacore knows (" << kAiterKnownAbiVersion
        << ")";
    lib.reason = msg.str();
    return;
  }

  auto entry = reinterpret_cast<mla_decode_stage1_asm_fwd_fn>(dlsym(handle, MLACORE_AITER_ENTRY_SYMBOL));
  if (entry == nullptr) {
    lib.reason = label + ": lacks symbol " MLACORE_AITER_ENTRY_SYMBOL;
    return;
  }
  lib.mla_decode_stage1 = entry;
  // Optional: their absence is not a refusal (decode still routes), only a
  // reason the appends stay native (backend_route.cpp says which).
  lib.concat_and_cache_mla =
      reinterpret_cast<aiter_concat_and_cache_mla_fn>(dlsym(handle, MLACORE_AITER_CONCAT_MLA_SYMBOL));
  lib.reshape_and_cache_flash =
      reinterpret_cast<aiter_reshape_and_cache_flash_fn>(dlsym(handle, MLACORE_AITER_RESHAPE_FLASH_SYMBOL));
  lib.loaded = true;
}

}  // namespace

const AiterLibrary& aiter_library() noexcept {
  static AiterLibrary lib;
  static std::once_flag once;
  // call_once re-runs the body if it throws; catching inside makes even an
  // allocation failure a cached answer, so the probe runs exactly once.
  std::call_once(once, [] {
    try {
      load(lib);
    } catch (const std::exception& e) {
      lib = AiterLibrary{};
      lib.reason = std::string("the AITER probe failed: ") + e.what();
    } catch (...) {
      lib = AiterLibrary{};
      lib.reason = "the AITER probe failed";
    }
  });
  return lib;
}

bool aiter_set_library_path(const char* path, std::string* why) {
  std::lock_guard<std::mutex> lock(g_path_mutex);
  if (g_probe_started) {
    if (why != nullptr)
      *why = "the AITER probe already ran in this process; hand the library over before the first backends() or "
             "routing call";
    return false;
  }
  g_handed_path = path != nullptr ? path : "";
  return true;
}

namespace {

std::string shape_text(const DLTensor& t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t.ndim && i < 16; ++i) s << (i ? ", " : "") << t.shape[i];
  if (t.ndim > 16) s << ", ...";
  s << (t.ndim == 1 ? ",)" : ")");
  return s.str();
}

}  // namespace

// Only dtypes whose AITER meaning does not depend on the GPU. fp8 is left
// out on purpose: AITER's fp8 is e4m3fnuz on gfx942 and e4m3fn on gfx950,
// so a DLPack fp8 maps to it only once the caller knows the arch.
bool to_aiter_dtype(DLDataType t, AiterDtype* out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) { *out = AITER_DTYPE_fp16; return true; }
      if (t.bits == 32) { *out = AITER_DTYPE_fp32; return true; }
      return false;
    case kDLBfloat:
      if (t.bits == 16) { *out = AITER_DTYPE_bf16; return true; }
      return false;
    case kDLInt:
      if (t.bits == 8) { *out = AITER_DTYPE_i8; return true; }
      if (t.bits == 16) { *out = AITER_DTYPE_i16; return true; }
      if (t.bits == 32) { *out = AITER_DTYPE_i32; return true; }
      if (t.bits == 64) { *out = AITER_DTYPE_i64; return true; }
      return false;
    case kDLUInt:
      if (t.bits == 8) { *out = AITER_DTYPE_u8; return true; }
      if (t.bits == 32) { *out = AITER_DTYPE_u32; return true; }
      if (t.bits == 64) { *out = AITER_DTYPE_u64; return true; }
      return false;
    default: return false;
  }
}

aiter_tensor_t aiter_view(void* ptr, AiterDtype dtype, int device_id, std::initializer_list<int64_t> shape,
                          std::initializer_list<int64_t> strides) {
  aiter_tensor_t t;
  std::memset(&t, 0, sizeof t);
  t.ptr = ptr;
  t.ndim = static_cast<int>(shape.size() < MLACORE_AITER_MAX_DIMS ? shape.size() : MLACORE_AITER_MAX_DIMS);
  t.dtype_ = dtype;
  t.device_id = device_id;
  uint64_t numel = 1;
  int i = 0;
  for (int64_t s : shape) {
    if (i == t.ndim) break;
    t.shape[i++] = s;
    numel *= static_cast<uint64_t>(s > 0 ? s : 0);
  }
  t.numel_ = static_cast<size_t>(numel);
  if (strides.size() == shape.size()) {
    i = 0;
    for (int64_t s : strides) {
      if (i == t.ndim) break;
      t.strides[i++] = s;
    }
  } else {
    int64_t compact = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.strides[d] = compact;
      compact *= t.shape[d] > 0 ? t.shape[d] : 1;
    }
  }
  return t;
}

bool to_aiter_tensor(const DLTensor& t, aiter_tensor_t* out, std::string* why) {
  auto fail = [&](const std::string& text) {
    if (why != nullptr) *why = text;
    return false;
  };
  if (out == nullptr) return fail("expected an aiter_tensor_t to fill, got NULL");
  std::memset(out, 0, sizeof *out);  // unused dims read as 0, not garbage
  if (t.ndim < 0 || t.ndim > MLACORE_AITER_MAX_DIMS) {
    std::ostringstream s;
    s << "expected at most " << MLACORE_AITER_MAX_DIMS << " dims (aiter_tensor_t's limit), got " << t.ndim;
    return fail(s.str());
  }
  if (t.ndim > 0 && t.shape == nullptr) return fail("expected a shape, got NULL");
  // CPU is accepted for the contract test's fake AITER, which runs on the
  // host; real AITER kernels need ROCm memory, which routing guarantees.
  if (t.device.device_type != kDLROCM && t.device.device_type != kDLCPU) {
    std::ostringstream s;
    s << "expected a ROCm (or, for the contract test, CPU) tensor, got DLPack device type "
      << static_cast<int>(t.device.device_type);
    return fail(s.str());
  }
  AiterDtype dtype{};
  if (!to_aiter_dtype(t.dtype, &dtype)) {
    std::ostringstream s;
    s << "expected float16, bfloat16, float32 or an 8-64 bit integer dtype with one lane, got DLPack dtype (code "
      << static_cast<int>(t.dtype.code) << ", bits " << static_cast<int>(t.dtype.bits) << ", lanes "
      << t.dtype.lanes << ")";
    return fail(s.str());
  }
  uint64_t numel = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return fail("expected non-negative sizes, got shape " + shape_text(t));
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(t.shape[i]), &numel))
      return fail("expected a shape whose element count fits 64 bits, got " + shape_text(t));
  }
  if (t.data == nullptr && numel > 0) return fail("expected data for a non-empty tensor, got NULL");

  out->ptr = t.data != nullptr ? static_cast<char*>(t.data) + t.byte_offset : nullptr;
  out->numel_ = static_cast<size_t>(numel);
  out->ndim = t.ndim;
  out->dtype_ = dtype;
  out->device_id = t.device.device_id;
  // DLPack's NULL strides mean compact row-major; AITER always reads them.
  int64_t compact = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    out->shape[i] = t.shape[i];
    out->strides[i] = t.strides != nullptr ? t.strides[i] : compact;
    compact *= t.shape[i] > 0 ? t.shape[i] : 1;
  }
  return true;
}

}  // namespace mlacore
