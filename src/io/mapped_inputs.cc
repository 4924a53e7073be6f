#include "io/mapped_inputs.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/interrupt.h"

namespace ckpt {
namespace {

// Fixed slots, read by the handler without locks: a slot's base is set last
// when it is filled and cleared first when it is emptied.
constexpr int kSlots = 8192;
struct Slot {
  std::atomic<uintptr_t> base{0};
  std::atomic<std::size_t> length{0};
  char path[256];
};
Slot g_slots[kSlots];
std::atomic<int> g_used{0};  // slots [0, g_used) may be filled
std::mutex g_fill;           // one writer of slots at a time
struct sigaction g_previous;

// The slot whose mapping holds `addr`, or -1. Async-signal-safe.
int slot_at(uintptr_t addr) {
  int used = g_used.load(std::memory_order_acquire);
  for (int i = 0; i < used; ++i) {
    uintptr_t base = g_slots[i].base.load(std::memory_order_acquire);
    if (base != 0 && addr >= base && addr - base < g_slots[i].length.load(std::memory_order_relaxed)) return i;
  }
  return -1;
}

extern "C" void on_sigbus(int sig, siginfo_t* info, void* context) {
  auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  if (int i = slot_at(addr); i >= 0) {
    // From the faulting page to the mapping's end: zeros, in one call, so
    // the rest of the lost pages do not fault one by one.
    static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    uintptr_t end = g_slots[i].base.load(std::memory_order_relaxed) + g_slots[i].length.load(std::memory_order_relaxed);
    uintptr_t from = addr & ~(page - 1), to = (end + page - 1) & ~(page - 1);
    if (::mmap(reinterpret_cast<void*>(from), to - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
        MAP_FAILED) {
      note_input_shrank(g_slots[i].path);
      return;  // the read is retried, and finds zeros
    }
  }
  // Not a mapped input's: the previous handler takes it (the instruction
  // faults again once this returns).
  ::sigaction(SIGBUS, &g_previous, nullptr);
  (void)sig;
  (void)context;
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO;
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

int register_mapped_input(const void* base, std::size_t length, const std::string& path) {
  install_once();
  std::lock_guard<std::mutex> lock(g_fill);
  int used = g_used.load(std::memory_order_relaxed);
  int slot = 0;
  while (slot < used && g_slots[slot].base.load(std::memory_order_relaxed) != 0) ++slot;
  if (slot == kSlots) return -1;
  Slot& s = g_slots[slot];
  std::size_t n = std::min(path.size(), sizeof s.path - 1);
  std::memcpy(s.path, path.data(), n);
  s.path[n] = '\0';
  s.length.store(length, std::memory_order_relaxed);
  s.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
  if (slot == used) g_used.store(used + 1, std::memory_order_release);
  return slot;
}

void check_write_source(const void* data, int err) {
  if (err != EFAULT) return;
  if (int i = slot_at(reinterpret_cast<uintptr_t>(data)); i >= 0) {
    note_input_shrank(g_slots[i].path);
    check_interrupted();  // throws DataLoss naming it
  }
}

void unregister_mapped_input(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_fill);
  g_slots[slot].base.store(0, std::memory_order_release);
}

}  // namespace ckpt
