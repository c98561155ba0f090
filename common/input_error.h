// The error for bad input a user can fix (a config, a plan, a size): its
// message names where the value came from and what was expected.
#pragma once

#include <stdexcept>

namespace vtrain::common {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace vtrain::common
