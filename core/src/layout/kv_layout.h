// Layout detection shared by the ops that care whether a (ckv, kpe) pair is
// the two halves of one per-token-interleaved cache (the C entry points in
// kv_layout.cpp, the append and decode backend routing).
#pragma once

#include <string>

#include "common/tensor.h"

namespace mlacore {

// Validates the pair as [P, S, Dc] / [P, S, Dp] caches (value_error
// otherwise) and tells whether they are adjacent halves. `why`, when given,
// receives every failed condition in words, or the view's description.
bool kv_halves_adjacent(const CheckedTensor& ckv, const CheckedTensor& kpe, std::string* why = nullptr);

}  // namespace mlacore
