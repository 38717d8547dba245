// The emulator's scheduler: threadgroups run one after another; each thread of a group is a
// ucontext fiber with its own stack, all on one OS thread (docs/metal.md §3).
//
// A fiber runs until it reaches a threadgroup barrier, a SIMD-group rendezvous or its end. When
// every fiber of the group is blocked, the scheduler releases
//   1. each SIMD group whose live lanes all wait at the same rendezvous (same call site, same
//      uniform argument), else
//   2. the threadgroup barrier, once every live thread waits at the same one.
// Anything else (lanes split between a collective and a barrier, threads at different barriers)
// aborts the dispatch with the source lines involved. A returned thread is no longer live, so
// `if (gid >= n) return;` before a barrier is legal (Apple silicon rule, MSL spec §6.9.1).
#include "emu_runtime.h"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>

#include "emu_interface.h"

namespace aura_emu {
namespace {

std::map<std::string, KernelEntry>& registry() {
  static std::map<std::string, KernelEntry> r;
  return r;
}

constexpr std::size_t kStackBytes = 64 * 1024;

enum class FiberState { runnable, at_barrier, at_rendezvous, done };

struct Fiber {
  ucontext_t ctx;
  char* stack = nullptr;
  FiberState state = FiberState::runnable;
  unsigned index = 0;  // linear thread index in the group (x fastest)
  const char* file = "";
  unsigned line = 0;
  long uniform = 0;
  unsigned rendezvous_count = 0;  // parity selects the mailbox half
  unsigned barrier_count = 0;     // threadgroup barriers reached so far
};

struct SimdGroup {
  // Two halves: a lane released from rendezvous n may deposit for n + 1 while a slower lane of
  // the same group still reads n; it cannot get two ahead, n + 1 needs the slow lane too.
  unsigned char mailbox[2][kSimdWidth][kMailboxBytes];
  unsigned live_mask[2] = {0, 0};
};

struct Dispatch {
  KernelEntry entry = nullptr;
  Grid3 groups, group_size;
  unsigned group_x = 0, group_y = 0, group_z = 0;
  void* buffers[kMaxBufferSlots] = {};
  std::vector<Fiber> fibers;
  std::vector<SimdGroup> simds;
  Fiber* current = nullptr;
  ucontext_t scheduler;
  std::string error;
  std::uint64_t group_serial = 0;  // one per threadgroup run: threadgroup arrays re-poison on change
  std::size_t threadgroup_bytes = 0;
  void* fault_address = nullptr;
};

thread_local Dispatch* t_dispatch = nullptr;

// Threadgroup arrays: address -> serial of the group that last poisoned it.
thread_local std::unordered_map<void*, std::uint64_t> t_array_serial;
thread_local std::uint64_t t_next_serial = 1;

// Fiber stacks, reused across dispatches; a PROT_NONE page below each catches an overflow.
struct StackPool {
  std::vector<char*> stacks;
  char* get(std::size_t i) {
    while (stacks.size() <= i) {
      std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
      void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      mprotect(p, page, PROT_NONE);
      stacks.push_back(static_cast<char*>(p) + page);
    }
    return stacks[i];
  }
};
thread_local StackPool t_stacks;

Dispatch& current_dispatch() { return *t_dispatch; }

// A memory fault inside a kernel (the harness puts every tensor right before a PROT_NONE page)
// ends the dispatch with an error instead of killing the process: the handler records the
// address and resumes the scheduler, abandoning the faulting fiber. Faults anywhere else get the
// default action.
void on_fault(int sig, siginfo_t* info, void*) {
  Dispatch* d = t_dispatch;
  if (d == nullptr || d->current == nullptr) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  char msg[96];
  std::snprintf(msg, sizeof msg, "memory fault at %p", info->si_addr);
  if (d->error.empty()) d->error = msg;
  d->fault_address = info->si_addr;
  d->current->state = FiberState::done;
  setcontext(&d->scheduler);
}

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa = {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
  });
  // The handler runs on an alternate stack: a fiber's own stack may be what overflowed.
  thread_local std::vector<char> alt(1 << 16);
  stack_t ss = {};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
}

void yield_to_scheduler() {
  Dispatch& d = current_dispatch();
  swapcontext(&d.current->ctx, &d.scheduler);
}

void fiber_main() {
  Dispatch& d = current_dispatch();
  d.entry();
  d.current->state = FiberState::done;
  swapcontext(&d.current->ctx, &d.scheduler);
}

std::string site(const char* file, unsigned line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

std::vector<unsigned> make_order(unsigned n, LaneOrder order, std::mt19937_64& rng) {
  std::vector<unsigned> v(n);
  for (unsigned i = 0; i < n; ++i) v[i] = i;
  if (order == LaneOrder::reverse) std::reverse(v.begin(), v.end());
  if (order == LaneOrder::shuffled) std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Releases SIMD groups whose live lanes all wait at one rendezvous; returns whether any did.
bool release_rendezvous(Dispatch& d) {
  bool released = false;
  for (unsigned s = 0; s < d.simds.size() && d.error.empty(); ++s) {
    unsigned lo = s * kSimdWidth, hi = std::min<unsigned>(lo + kSimdWidth, d.fibers.size());
    unsigned live = 0, waiting = 0;
    const Fiber* first = nullptr;
    const Fiber* other = nullptr;
    for (unsigned i = lo; i < hi; ++i) {
      const Fiber& f = d.fibers[i];
      if (f.state == FiberState::done) continue;
      live |= 1u << (i - lo);
      if (f.state == FiberState::at_rendezvous) {
        ++waiting;
        if (!first) first = &f;
        else if (f.file != first->file || f.line != first->line) other = &f;
        else if (f.uniform != first->uniform && f.uniform != kNotUniform)
          d.error = "SIMD collective at " + site(f.file, f.line) + ": argument that must be uniform differs between lanes (" +
                    std::to_string(first->uniform) + " vs " + std::to_string(f.uniform) + ")";
      } else {
        other = &f;
      }
    }
    if (!waiting || !d.error.empty()) continue;
    if (other) {
      d.error = "SIMD collective at " + site(first->file, first->line) + " reached by only some live lanes of SIMD group " +
                std::to_string(s) + "; lane " + std::to_string(other->index % kSimdWidth) + " waits at " + site(other->file, other->line);
      return false;
    }
    unsigned parity = first->rendezvous_count & 1u;
    d.simds[s].live_mask[parity] = live;
    for (unsigned i = lo; i < hi; ++i)
      if (d.fibers[i].state == FiberState::at_rendezvous) d.fibers[i].state = FiberState::runnable;
    released = true;
  }
  return released;
}

void run_group(Dispatch& d, LaneOrder order, std::mt19937_64& rng) {
  unsigned n = d.group_size.count();
  d.group_serial = t_next_serial++;
  d.threadgroup_bytes = 0;
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = d.fibers[i];
    f = Fiber{};
    f.index = i;
    f.stack = t_stacks.get(i);
    if (!f.stack) {
      d.error = "out of memory for fiber stacks";
      return;
    }
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  while (d.error.empty()) {
    for (unsigned i : make_order(n, order, rng)) {
      Fiber& f = d.fibers[i];
      while (f.state == FiberState::runnable && d.error.empty()) {
        d.current = &f;
        swapcontext(&d.scheduler, &f.ctx);
      }
      if (!d.error.empty()) return;
    }
    if (release_rendezvous(d)) continue;
    if (!d.error.empty()) return;
    const Fiber* first = nullptr;
    for (const Fiber& f : d.fibers) {
      if (f.state != FiberState::at_barrier) continue;
      if (!first) first = &f;
      else if (f.file != first->file || f.line != first->line) {
        d.error = "threads of one threadgroup wait at different barriers: thread " + std::to_string(first->index) + " at " +
                  site(first->file, first->line) + ", thread " + std::to_string(f.index) + " at " + site(f.file, f.line);
        return;
      }
      else if (f.barrier_count != first->barrier_count) {
        // same line, different iteration: loop trip counts differ between threads
        d.error = "threads of one threadgroup meet at the barrier at " + site(f.file, f.line) + " after different numbers of "
                  "barriers (thread " + std::to_string(first->index) + ": " + std::to_string(first->barrier_count) +
                  ", thread " + std::to_string(f.index) + ": " + std::to_string(f.barrier_count) + ")";
        return;
      }
    }
    if (!first) return;  // every thread returned
    for (const Fiber& f : d.fibers) {
      // Convention (docs/metal.md §5), stricter than Metal: a thread returns before its first
      // barrier or after its last, never in between; otherwise loop trip counts or early exits
      // differ between threads and the kernel relies on the returned-thread rule by accident.
      if (f.state == FiberState::done && f.barrier_count > 0 && f.barrier_count < first->barrier_count) {
        d.error = "thread " + std::to_string(f.index) + " returned after " + std::to_string(f.barrier_count) +
                  " barriers while thread " + std::to_string(first->index) + " waits at its barrier number " +
                  std::to_string(first->barrier_count) + " (" + site(first->file, first->line) + ")";
        return;
      }
    }
    for (Fiber& f : d.fibers)
      if (f.state == FiberState::at_barrier) f.state = FiberState::runnable;
  }
}

}  // namespace

Registrar::Registrar(const char* host_name, KernelEntry entry) { registry()[host_name] = entry; }

void*& last_fault_address() {
  thread_local void* address = nullptr;
  return address;
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (auto& kv : registry()) names.push_back(kv.first);
  return names;
}

void* buffer_address(int slot) {
  Dispatch& d = current_dispatch();
  if (slot < 0 || slot >= kMaxBufferSlots || !d.buffers[slot]) {
    fail(("buffer slot " + std::to_string(slot) + " is not bound").c_str(), "kernel argument", 0);
    return nullptr;
  }
  return d.buffers[slot];
}

Idx3 builtin_index(int which) {
  Dispatch& d = current_dispatch();
  const Fiber& f = *d.current;
  Grid3 gs = d.group_size;
  unsigned n = gs.count();
  Idx3 tid{f.index % gs.x, (f.index / gs.x) % gs.y, f.index / (gs.x * gs.y)};
  switch (which) {
    case kTidInGrid: return {d.group_x * gs.x + tid.x, d.group_y * gs.y + tid.y, d.group_z * gs.z + tid.z};
    case kTidInGroup: return tid;
    case kGroupInGrid: return {d.group_x, d.group_y, d.group_z};
    case kThreadsPerGroup: return {gs.x, gs.y, gs.z};
    case kGroupsPerGrid: return {d.groups.x, d.groups.y, d.groups.z};
    case kThreadsPerGrid: return {d.groups.x * gs.x, d.groups.y * gs.y, d.groups.z * gs.z};
    case kIndexInGroup: return {f.index, 0, 0};
    case kLaneInSimd: return {f.index % kSimdWidth, 0, 0};
    case kSimdInGroup: return {f.index / kSimdWidth, 0, 0};
    case kThreadsPerSimd: return {kSimdWidth, 0, 0};
    case kSimdsPerGroup: return {(n + kSimdWidth - 1) / kSimdWidth, 0, 0};
  }
  return {0, 0, 0};
}

void fail(const char* what, const char* file, unsigned line) {
  Dispatch& d = current_dispatch();
  if (d.error.empty()) d.error = std::string(what) + (line ? " at " + site(file, line) : std::string());
  d.current->state = FiberState::done;
  swapcontext(&d.current->ctx, &d.scheduler);  // never resumed
}

void threadgroup_barrier_at(const char* file, unsigned line) {
  Fiber& f = *current_dispatch().current;
  f.state = FiberState::at_barrier;
  f.file = file;
  f.line = line;
  ++f.barrier_count;
  yield_to_scheduler();
}

Rendezvous simd_rendezvous(const void* in, unsigned bytes, long uniform, const char* file, unsigned line) {
  Dispatch& d = current_dispatch();
  Fiber& f = *d.current;
  SimdGroup& g = d.simds[f.index / kSimdWidth];
  unsigned parity = f.rendezvous_count & 1u, lane = f.index % kSimdWidth;
  if (bytes) std::memcpy(g.mailbox[parity][lane], in, bytes);
  f.state = FiberState::at_rendezvous;
  f.file = file;
  f.line = line;
  f.uniform = uniform;
  yield_to_scheduler();
  ++f.rendezvous_count;
  return Rendezvous{&g.mailbox[parity][0][0], g.live_mask[parity], lane};
}

void threadgroup_array(void* base, std::size_t bytes, const char* file, unsigned line) {
  Dispatch& d = current_dispatch();
  std::uint64_t& serial = t_array_serial[base];
  if (serial == d.group_serial) return;
  serial = d.group_serial;
  std::memset(base, 0xFF, bytes);  // NaN in every float type, all ones in integers
  d.threadgroup_bytes += bytes;
  if (d.threadgroup_bytes > kMaxThreadgroupMemory)
    fail(("threadgroup memory " + std::to_string(d.threadgroup_bytes) + " bytes exceeds the 32 KiB Metal limit").c_str(), file, line);
}

std::string run_dispatch(const std::string& kernel, Grid3 groups, Grid3 group_size, void* const* buffers,
                         int n_buffers, LaneOrder order, std::uint64_t seed) {
  auto it = registry().find(kernel);
  if (it == registry().end()) return "no kernel registered under host name '" + kernel + "'";
  unsigned n = group_size.count();
  if (n == 0 || n > kMaxThreadsPerGroup)
    return kernel + ": " + std::to_string(n) + " threads per threadgroup (Metal allows 1 to 1024)";
  if (n_buffers > kMaxBufferSlots) return kernel + ": more than 31 buffer slots";
  if (groups.count() == 0) return "";
  Dispatch d;
  d.entry = it->second;
  d.groups = groups;
  d.group_size = group_size;
  for (int i = 0; i < n_buffers; ++i) d.buffers[i] = buffers[i];
  d.fibers.resize(n);
  d.simds.resize((n + kSimdWidth - 1) / kSimdWidth);
  install_fault_handler();
  Dispatch* outer = t_dispatch;
  t_dispatch = &d;
  std::mt19937_64 rng(seed);
  for (unsigned g : make_order(groups.count(), order, rng)) {
    d.group_x = g % groups.x;
    d.group_y = (g / groups.x) % groups.y;
    d.group_z = g / (groups.x * groups.y);
    run_group(d, order, rng);
    if (!d.error.empty()) break;
  }
  t_dispatch = outer;
  if (d.fault_address) last_fault_address() = d.fault_address;
  return d.error.empty() ? "" : kernel + ": " + d.error;
}

}  // namespace aura_emu
