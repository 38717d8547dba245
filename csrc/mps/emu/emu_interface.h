// emu_interface.h: what a shader unit (through metal_emu.h) and the fiber runtime share. No
// macros here: the runtime includes it without the MSL keyword macros of metal_emu.h.
#pragma once

#include <cstddef>

namespace aura_emu {

enum Builtin : int {
  kTidInGrid, kTidInGroup, kGroupInGrid, kThreadsPerGroup, kGroupsPerGrid, kThreadsPerGrid,
  kIndexInGroup, kLaneInSimd, kSimdInGroup, kThreadsPerSimd, kSimdsPerGroup,
};
constexpr unsigned kSimdWidth = 32;

struct Idx3 {
  unsigned x, y, z;
};

void* buffer_address(int slot);                     // the current dispatch's binding
Idx3 builtin_index(int which);                      // of the running fiber
void threadgroup_barrier_at(const char* file, unsigned line);
void fail(const char* what, const char* file, unsigned line);  // aborts the dispatch

// A SIMD-group rendezvous: deposits `bytes` of this lane's input, waits until every live lane of
// the SIMD group arrived at the same call site with the same `uniform` value, then returns the
// mailbox of all lanes (stride kMailboxBytes) and the mask of live lanes.
constexpr unsigned kMailboxBytes = 96;
constexpr long kNotUniform = -0x7fffffffffffffffL;  // `uniform` value of a rendezvous that checks none
struct Rendezvous {
  const unsigned char* lanes;  // lane i's deposit at lanes + i * kMailboxBytes
  unsigned live_mask;
  unsigned lane;
};
Rendezvous simd_rendezvous(const void* in, unsigned bytes, long uniform, const char* file, unsigned line);

// Registers a threadgroup array; the first touch by a new threadgroup fills it with 0xFF bytes
// (NaN for every float type, all ones for integers) and counts it against the 32 KiB limit.
void threadgroup_array(void* base, std::size_t bytes, const char* file, unsigned line);

using KernelEntry = void (*)();
struct Registrar {
  Registrar(const char* host_name, KernelEntry entry);
};

}  // namespace aura_emu
