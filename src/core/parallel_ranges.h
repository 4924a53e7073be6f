// Splitting a range of work items over threads, for the CPU backend and the
// host side of the CUDA plugin (header-only so that the plugin, which does
// not link the executor library, shares it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace ckpt {

// Below this many bytes per thread, starting a thread costs more than it saves.
inline constexpr uint64_t kMinBytesPerThread = 4u << 20;

// Threads worth starting for `bytes` of work given at most `threads`.
inline int useful_threads(uint64_t bytes, int threads) {
  uint64_t by_size = std::max<uint64_t>(1, bytes / kMinBytesPerThread);
  return static_cast<int>(
      std::max<uint64_t>(1, std::min<uint64_t>(by_size, static_cast<uint64_t>(std::max(1, threads)))));
}

// Calls fn(part, begin, end) for `parts` contiguous pieces of [0, n) on
// `parts` threads (the calling thread takes the first) and rethrows the
// first exception any of them raised once all have finished.
template <typename Fn>
void for_each_range(int64_t n, int parts, Fn&& fn) {
  parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(parts, n)));
  if (parts == 1) {
    fn(0, int64_t{0}, n);
    return;
  }
  int64_t per = (n + parts - 1) / parts;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(parts));
  auto run = [&](int p) {
    int64_t begin = std::min(n, p * per), end = std::min(n, begin + per);
    try {
      if (begin < end) fn(p, begin, end);
    } catch (...) {
      errors[static_cast<std::size_t>(p)] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(parts - 1));
  for (int p = 1; p < parts; ++p) workers.emplace_back(run, p);
  run(0);
  for (auto& w : workers) w.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ckpt
