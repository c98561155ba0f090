// The balancer's exceptions. Expected outcomes such as "this batch cannot be
// split" are InfeasibleErrors with a message meant for the user; anything
// else (malformed input, a solver failure) is a BalancerError.
#pragma once

#include <stdexcept>

namespace vtrain::balancer {

// Every failure of the balancer: invalid input, a solver failure, a time limit.
class BalancerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The problem has no solution. The message says which requirement cannot be
// met, in the user's terms (e.g. "batch 512 does not fit: the devices can
// hold at most 384 samples together (...)").
class InfeasibleError : public BalancerError {
 public:
  using BalancerError::BalancerError;
};

}  // namespace vtrain::balancer
