#include "tensor_args.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace mlacore::bind {
namespace {

// Per-type cache of the exchange API. Python types that carry it are few
// (torch.Tensor, nn.Parameter, ...), so a short linear table suffices; it
// holds a reference to each type so a cached address is never reused.
//
// Those references are dropped again at interpreter exit (Python's atexit,
// which runs before modules are torn down). A type pinned past shutdown pins
// its methods and, through their __globals__, the dict of the module that
// defined it, which the interpreter then never clears: every object that
// module holds (an MlaPlan in a global, say) outlives Python, and nanobind's
// exit check reports "leaked instances" of mlacore._mlacore.Plan. Any class
// reaches the cache: a torch.Tensor subclass, or a wrong argument's type.
struct ApiCacheEntry {
  PyTypeObject* type;
  const DLPackExchangeAPI* api;
};
constexpr int kApiCacheSize = 8;
ApiCacheEntry api_cache[kApiCacheSize];
int api_cache_used = 0;
enum class CacheState { unregistered, open, closed };
CacheState api_cache_state = CacheState::unregistered;

void release_api_cache() {
  // Stop caching first: a type's deallocation may run code that converts tensors.
  api_cache_state = CacheState::closed;
  ApiCacheEntry entries[kApiCacheSize];
  const int n = api_cache_used;
  std::copy(api_cache, api_cache + n, entries);
  api_cache_used = 0;
  for (int i = 0; i < n; ++i) Py_DECREF(entries[i].type);
}

// True when the cache may take a new entry: the first call registers the
// release with atexit; after it ran (or if registering failed) nothing is cached.
bool api_cache_open() {
  if (api_cache_state == CacheState::unregistered) {
    api_cache_state = CacheState::closed;
    try {
      nb::module_::import_("atexit").attr("register")(nb::cpp_function(&release_api_cache));
      api_cache_state = CacheState::open;
    } catch (const nb::python_error&) {
      // e.g. during interpreter shutdown: run uncached (the error is cleared).
    }
  }
  return api_cache_state == CacheState::open;
}

const DLPackExchangeAPI* lookup_api(PyTypeObject* type) {
  for (int i = 0; i < api_cache_used; ++i)
    if (api_cache[i].type == type) return api_cache[i].api;

  const DLPackExchangeAPI* api = nullptr;
  PyObject* capsule = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
  if (capsule == nullptr) {
    PyErr_Clear();
  } else {
    if (PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
      auto* candidate = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(capsule, "dlpack_exchange_api"));
      if (candidate != nullptr && candidate->header.version.major == DLPACK_MAJOR_VERSION &&
          candidate->dltensor_from_py_object_no_sync != nullptr)
        api = candidate;
    }
    Py_DECREF(capsule);
  }
  if (api_cache_used < kApiCacheSize && api_cache_open()) {
    Py_INCREF(type);
    api_cache[api_cache_used++] = {type, api};
  }
  return api;
}

// The producer refused to export `obj` (torch: a meta, sparse or conjugate
// tensor): a ValueError naming the argument with the producer's first line,
// in place of its RuntimeError or BufferError (and C++ backtrace).
[[noreturn]] void raise_unexportable(const char* name) {
  nb::python_error err;
  if (!err.matches(PyExc_BufferError) && !err.matches(PyExc_RuntimeError) && !err.matches(PyExc_ValueError) &&
      !err.matches(PyExc_TypeError))
    throw err;
  std::string why = nb::str(err.value()).c_str();
  why = why.substr(0, why.find('\n'));
  throw nb::value_error((std::string(name) + ": expected a strided tensor in memory (no meta, sparse, conjugate or "
                         "negative view), but it cannot be exported: " + why).c_str());
}

// DLPack has no negative bit: a torch view with it set (torch._neg_view)
// exports the un-negated values, so it is refused rather than read wrong.
void expect_no_neg_bit(nb::handle obj, const char* name) {
  static PyObject* const is_neg = PyUnicode_InternFromString("is_neg");
  PyObject* r = PyObject_CallMethodNoArgs(obj.ptr(), is_neg);
  if (r == nullptr) {  // not a torch tensor: nothing to check
    PyErr_Clear();
    return;
  }
  const bool neg = r == Py_True;
  Py_DECREF(r);
  if (neg)
    throw nb::value_error((std::string(name) + ": expected a tensor without torch's negative bit, got a negative "
                           "view (call .resolve_neg() first)").c_str());
}

void convert_fallback(nb::handle obj, const char* name, BorrowedTensor& out) {
  if (!nb::hasattr(obj, "__dlpack__")) {
    std::string kind = nb::type_name(obj.type()).c_str();
    throw nb::type_error((std::string(name) + ": expected a tensor (an object with __dlpack__), got " + kind).c_str());
  }
  nb::object capsule;
  try {
    capsule = obj.attr("__dlpack__")();
  } catch (nb::python_error& e) {
    e.restore();
    raise_unexportable(name);
  }
  expect_no_neg_bit(obj, name);
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    throw nb::type_error((std::string(name) + ": __dlpack__() did not return a 'dltensor' capsule").c_str());
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  out.dl = managed->dl_tensor;
  // The capsule stays un-consumed: its destructor frees the tensor once the
  // call is over and `keep` is released.
  out.keep = std::move(capsule);
  out.api = nullptr;
  out.present = true;
}

}  // namespace

void convert(nb::handle obj, const char* name, BorrowedTensor& out) {
  if (obj.is_none())
    throw nb::type_error((std::string(name) + ": expected a tensor, got None").c_str());
  const DLPackExchangeAPI* api = lookup_api(Py_TYPE(obj.ptr()));
  if (api == nullptr) return convert_fallback(obj, name, out);
  if (api->dltensor_from_py_object_no_sync(obj.ptr(), &out.dl) != 0) raise_unexportable(name);
  expect_no_neg_bit(obj, name);
  out.api = api;
  out.present = true;
}

void convert_optional(nb::handle obj, const char* name, BorrowedTensor& out) {
  if (obj.is_none()) {
    out.present = false;
    return;
  }
  convert(obj, name, out);
}

void* stream_for(const BorrowedTensor& anchor, nb::handle stream) {
  if (!stream.is_none()) return reinterpret_cast<void*>(nb::cast<uintptr_t>(stream));
  const DLDeviceType type = anchor.dl.device.device_type;
  if (!anchor.present || anchor.api == nullptr || (type != kDLCUDA && type != kDLROCM)) return nullptr;
  void* current = nullptr;
  if (anchor.api->current_work_stream(type, anchor.dl.device.device_id, &current) != 0) throw nb::python_error();
  return current;
}

void raise_status(mlacore_status status) {
  const char* message = mlacore_last_error();
  switch (status) {
    case MLACORE_ERROR_VALUE: throw nb::value_error(message);
    case MLACORE_ERROR_TYPE: throw nb::type_error(message);
    default: throw std::runtime_error(message);
  }
}

}  // namespace mlacore::bind
