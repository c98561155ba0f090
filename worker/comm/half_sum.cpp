#include "worker/comm/half_sum.h"

#include <stdexcept>

#include "common/half.h"

namespace vtrain::worker {
namespace {

template <typename Half, Half (*round)(float)>
void add_into(const void* in, void* inout, int64_t count) {
  const Half* a = static_cast<const Half*>(in);
  Half* b = static_cast<Half*>(inout);
  for (int64_t i = 0; i < count; ++i) {
    b[i] = round(common::to_float(a[i]) + common::to_float(b[i]));
  }
}

}  // namespace

void add_half_elements(const void* in, void* inout, int64_t count, common::DataType type) {
  switch (type) {
    case common::DataType::kBF16:
      return add_into<common::Bf16, common::to_bf16>(in, inout, count);
    case common::DataType::kF16:
      return add_into<common::F16, common::to_f16>(in, inout, count);
    case common::DataType::kF32:
      break;
  }
  throw std::invalid_argument(std::string("add_half_elements: expected a 16-bit type, got ") +
                              common::dtype_name(type));
}

}  // namespace vtrain::worker
