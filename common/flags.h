// Command-line flags for the lazykv subcommands. Each flag may also come from
// the environment as LAZYKV_<NAME> (upper case, '-' -> '_'); the command line
// wins. Unknown flags and bad values are errors that list what is valid.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lazykv {

class Flags {
 public:
  explicit Flags(std::string command) : command_(std::move(command)) {}

  // Declares a flag with its default value ("" for none) and one line of help.
  Flags& add(const std::string& name, const std::string& default_value, const std::string& help);
  // Declares a boolean switch (present = true).
  Flags& add_switch(const std::string& name, const std::string& help);

  // Parses args (without the program and subcommand names). Throws
  // Error(kInvalidArgument) for unknown flags or missing values.
  void parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_; }
  std::string usage() const;

  const std::string& get(const std::string& name) const;
  bool is_set(const std::string& name) const;  // given on the command line or environment
  int64_t get_int(const std::string& name) const;
  // get_int, and an error naming the flag when the value is outside [lo, hi].
  int64_t get_int_in(const std::string& name, int64_t lo, int64_t hi) const;
  double get_double(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  // All values of a flag given several times (e.g. --stop).
  const std::vector<std::string>& get_all(const std::string& name) const;

 private:
  struct Flag {
    std::string value;
    std::string help;
    bool is_switch = false;
    bool set = false;
    std::vector<std::string> all;
  };
  const Flag& find(const std::string& name) const;

  std::string command_;
  std::map<std::string, Flag> flags_;
  bool help_ = false;
};

}  // namespace lazykv
