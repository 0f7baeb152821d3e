// Conversion of Python tensors into borrowed DLTensors, and of core statuses
// into Python exceptions. This is all the binding layer does.
//
// Fast path: torch's DLPack C exchange API (`type.__dlpack_c_exchange_api__`,
// DLPack 1.3) fills a DLTensor on the stack in ~0.1 us and reports the
// current stream, without linking libtorch. Objects without it fall back to
// `__dlpack__()` (a capsule held for the duration of the call).
#pragma once

#include <nanobind/nanobind.h>

#include <dlpack/dlpack.h>
#include <mlacore/mlacore.h>

namespace nb = nanobind;

namespace mlacore::bind {

// A Python object converted into a DLTensor borrowed for one call (plus what
// keeps it alive on the fallback path). Unchecked: the core validates it as
// a CheckedTensor (core/src/common/tensor.h) when the call reaches it.
struct BorrowedTensor {
  DLTensor dl{};
  const DLPackExchangeAPI* api = nullptr;  // null on the __dlpack__ fallback
  nb::object keep;                          // fallback capsule
  bool present = false;                     // false for an optional None

  const DLTensor* get() const { return present ? &dl : nullptr; }
};

// Converts `obj` (named `name` in errors); TypeError when it is no tensor.
void convert(nb::handle obj, const char* name, BorrowedTensor& out);

// Same, but None gives an absent argument (get() == nullptr).
void convert_optional(nb::handle obj, const char* name, BorrowedTensor& out);

// The stream to launch on: `stream` when it is an int (a raw cudaStream_t or
// hipStream_t), else the producer's current stream on `anchor`'s device
// (NULL for CPU tensors and for producers without the exchange API).
void* stream_for(const BorrowedTensor& anchor, nb::handle stream);

// Raises the Python exception that matches a failed status.
void raise_status(mlacore_status status);

inline void check(mlacore_status status) {
  if (status != MLACORE_OK) raise_status(status);
}

// Runs a core call that may launch work with the GIL released, as torch's own
// ops do: a launch can block (a full launch queue; compute-sanitizer makes every
// launch wait for its kernel), and a thread that blocks holding the GIL stalls
// every other Python thread. Arguments are converted and the stream resolved
// before; errors are raised after, with the GIL held again.
template <class Call>
mlacore_status without_gil(Call&& call) {
  nb::gil_scoped_release release;
  return call();
}

}  // namespace mlacore::bind
