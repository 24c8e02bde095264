// Helpers for the tensor-parallel tests: N ranks as threads in this process,
// joined by Gloo over loopback through Gloo's in-memory HashStore.
#pragma once

#include <gloo/rendezvous/hash_store.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "worker/parallel/gloo_group.h"
#include "worker/parallel/group.h"

namespace lazykv {

// Runs body(group) on `world` threads, one GlooGroup each; rethrows the first
// rank's exception (in rank order) after every thread has finished.
inline void run_ranks(int world, const std::function<void(TensorParallelGroup&)>& body,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  gloo::rendezvous::HashStore store;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooGroupOptions options;
        options.rank = r;
        options.world = world;
        options.timeout = timeout;
        GlooGroup group(options, store);
        body(group);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// body(group) as a worker of `world` ranks sees it: a SoloGroup for one (a
// worker outside any group), run_ranks for more.
inline void run_as_world(int world, const std::function<void(TensorParallelGroup&)>& body) {
  if (world == 1) {
    SoloGroup solo;
    body(solo);
  } else {
    run_ranks(world, body);
  }
}

}  // namespace lazykv
