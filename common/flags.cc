#include "common/flags.h"

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "common/error.h"

namespace lazykv {
namespace {

std::string env_name(const std::string& flag) {
  std::string s = "LAZYKV_";
  for (char ch : flag) s += ch == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

Flags& Flags::add(const std::string& name, const std::string& default_value, const std::string& help) {
  Flag f;
  f.value = default_value;
  f.help = help;
  if (const char* env = std::getenv(env_name(name).c_str())) {
    f.value = env;
    f.set = true;
    f.all = {env};
  }
  flags_[name] = f;
  return *this;
}

Flags& Flags::add_switch(const std::string& name, const std::string& help) {
  add(name, "false", help);
  flags_[name].is_switch = true;
  return *this;
}

void Flags::parse(const std::vector<std::string>& args) {
  std::map<std::string, bool> from_cli;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      throw Error(ErrorCode::kInvalidArgument, command_ + ": unexpected argument '" + a + "'\n" + usage());
    }
    std::string name = a.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      throw Error(ErrorCode::kInvalidArgument, command_ + ": unknown flag --" + name + "\n" + usage());
    }
    Flag& f = it->second;
    if (f.is_switch) {
      value = has_value ? value : "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) throw Error(ErrorCode::kInvalidArgument, command_ + ": --" + name + " needs a value");
      value = args[++i];
    }
    if (!from_cli[name]) f.all.clear();  // the command line replaces the environment
    from_cli[name] = true;
    f.value = value;
    f.set = true;
    f.all.push_back(value);
  }
}

std::string Flags::usage() const {
  std::ostringstream out;
  out << "usage: lazykv " << command_ << " [flags]\n";
  for (const auto& [name, f] : flags_) {
    out << "  --" << name << (f.is_switch ? "" : " VALUE") << "  " << f.help;
    if (!f.is_switch && !f.value.empty() && !f.set) out << " (default " << f.value << ")";
    out << "  [env " << env_name(name) << "]\n";
  }
  return out.str();
}

const Flags::Flag& Flags::find(const std::string& name) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) throw Error(ErrorCode::kInternal, "flag --" + name + " was not declared");
  return it->second;
}

const std::string& Flags::get(const std::string& name) const { return find(name).value; }
bool Flags::is_set(const std::string& name) const { return find(name).set; }
const std::vector<std::string>& Flags::get_all(const std::string& name) const { return find(name).all; }

int64_t Flags::get_int(const std::string& name) const {
  const std::string& v = get(name);
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(ErrorCode::kInvalidArgument, "--" + name + " expects an integer, got '" + v + "'");
}

int64_t Flags::get_int_in(const std::string& name, int64_t lo, int64_t hi) const {
  const int64_t x = get_int(name);
  if (x < lo || x > hi) {
    throw Error(ErrorCode::kInvalidArgument,
                "--" + name + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                    std::to_string(x));
  }
  return x;
}

double Flags::get_double(const std::string& name) const {
  const std::string& v = get(name);
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(ErrorCode::kInvalidArgument, "--" + name + " expects a number, got '" + v + "'");
}

bool Flags::get_bool(const std::string& name) const {
  const std::string& v = get(name);
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  throw Error(ErrorCode::kInvalidArgument, "--" + name + " expects true or false, got '" + v + "'");
}

}  // namespace lazykv
