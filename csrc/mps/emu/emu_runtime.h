// The emulator's dispatch interface, for the harness (never included by a shader unit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace aura_emu {

// Metal limits checked at launch (docs/metal.md §3).
constexpr unsigned kMaxThreadsPerGroup = 1024;
constexpr std::size_t kMaxThreadgroupMemory = 32 * 1024;
constexpr int kMaxBufferSlots = 31;

// In which order fibers (and threadgroups) are started between barriers. The GPU promises none,
// so every test runs several: a result that depends on it is a race.
enum class LaneOrder : int { forward = 0, reverse = 1, shuffled = 2 };

struct Grid3 {
  unsigned x = 1, y = 1, z = 1;
  unsigned count() const { return x * y * z; }
};

// Runs `kernel` (a registered host name) over groups x group_size with the given buffer slots
// (nullptr = unbound). Returns "" on success, else what went wrong (kernel line included).
std::string run_dispatch(const std::string& kernel, Grid3 groups, Grid3 group_size,
                         void* const* buffers, int n_buffers, LaneOrder order, std::uint64_t seed);

std::vector<std::string> kernel_names();

// Address of the last memory fault a dispatch turned into an error (the harness names the
// argument whose guard page it hit).
void*& last_fault_address();

}  // namespace aura_emu
