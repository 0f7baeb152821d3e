// The entry points the fuzz driver exercises, one file each.
#pragma once

#include "harness.h"

namespace fuzz {

void fuzz_slot_mapping(Rng& r, Counter& c);
void fuzz_block_table(Rng& r, Counter& c);
void fuzz_batch_positions(Rng& r, Counter& c);
void fuzz_kv_layout(Rng& r, Counter& c);
void fuzz_append_mla(Rng& r, Counter& c);
void fuzz_append_kv(Rng& r, Counter& c);
void fuzz_plan(Rng& r, Counter& c);
void fuzz_decode(Rng& r, Counter& c);

}  // namespace fuzz
