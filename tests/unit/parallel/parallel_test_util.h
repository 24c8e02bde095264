// Helpers for the tensor-parallel tests: N ranks as threads in this process,
// joined by Gloo over loopback through a fresh rendezvous directory.
#pragma once

#include <unistd.h>

#include <atomic>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "worker/parallel/gloo_group.h"

namespace lazykv {

inline std::string fresh_rendezvous_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("lazykv_tp_" + name + "_" + std::to_string(::getpid()) + "_" +
                                     std::to_string(counter.fetch_add(1)));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Runs body(group) on `world` threads, one GlooGroup each; rethrows the first
// rank's exception (in rank order) after every thread has finished.
inline void run_ranks(int world, const std::string& name, const std::function<void(TensorParallelGroup&)>& body,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  const std::string dir = fresh_rendezvous_dir(name);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooGroupOptions options;
        options.rank = r;
        options.world = world;
        options.rendezvous_dir = dir;
        options.timeout = timeout;
        GlooGroup group(options);
        body(group);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::filesystem::remove_all(dir);
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace lazykv
