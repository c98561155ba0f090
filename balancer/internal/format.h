// Number formatting for the balancer's messages.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace vtrain::balancer::internal {

// "512 B", "1.50 KiB", "384 MiB", "2.25 GiB": binary units, at most three
// significant decimals, trailing zeros dropped.
std::string format_bytes(uint64_t bytes);

// "8, 16, 32": a list of integers, comma separated.
std::string format_list(std::span<const int64_t> values);

}  // namespace vtrain::balancer::internal
