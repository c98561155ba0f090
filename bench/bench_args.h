// Command-line reading shared by the C++ benchmark drivers.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace vtrain::bench {

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Walks argv: arg() is the option at hand, value() the word after it (exits
// 2 naming the option when there is none).
class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool next() { return ++i_ < argc_; }
  std::string arg() const { return argv_[i_]; }
  std::string value() {
    if (i_ + 1 >= argc_) {
      std::fprintf(stderr, "%s needs a value\n", argv_[i_]);
      std::exit(2);
    }
    return argv_[++i_];
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

}  // namespace vtrain::bench
