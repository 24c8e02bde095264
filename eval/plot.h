// Renders a result JSON of `lazykv eval` to a PNG with eval/plot.py.
#pragma once

#include <string>

namespace lazykv::eval {

// The plot script beside the sources.
std::string plot_script_path();

// Runs `/usr/bin/python3 eval/plot.py json_path png_path` (no shell).
// Throws Error(kInternal) with the script's exit status when plotting fails.
void run_plot(const std::string& json_path, const std::string& png_path);

}  // namespace lazykv::eval
