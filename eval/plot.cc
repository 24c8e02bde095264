#include "eval/plot.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/error.h"

#ifndef LAZYKV_SOURCE_DIR
#define LAZYKV_SOURCE_DIR "."
#endif

extern char** environ;

namespace lazykv::eval {

std::string plot_script_path() { return std::string(LAZYKV_SOURCE_DIR) + "/eval/plot.py"; }

void run_plot(const std::string& json_path, const std::string& png_path) {
  const std::string python = "/usr/bin/python3";
  const std::string script = plot_script_path();
  if (!std::filesystem::exists(script)) throw Error(ErrorCode::kNotFound, "plot script not found: " + script);
  // posix_spawn with an argument vector: paths need no shell quoting.
  std::vector<std::string> args = {python, script, json_path, png_path};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw Error(ErrorCode::kInternal, "cannot run " + python + ": " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error(ErrorCode::kInternal, "waiting for the plot script failed");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw Error(ErrorCode::kInternal, "plotting " + json_path + " to " + png_path + " failed (" + python + " " +
                                          script + " exited with status " +
                                          std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                                          "; is python3-matplotlib installed? scripts/setup.sh installs it)");
  }
}

}  // namespace lazykv::eval
