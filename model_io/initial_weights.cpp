#include "model_io/initial_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "common/text.h"
#include "model_io/safetensors.h"
#include "model_io/weight_names.h"

namespace vtrain::model_io {
namespace {

// Lists longer than this are cut, saying how many more there are.
constexpr size_t kListed = 20;

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < kListed; ++i) {
    text += (i ? ", " : "") + names[i];
  }
  if (names.size() > kListed) text += ", ... (" + std::to_string(names.size() - kListed) + " more)";
  return text;
}

bool integer_dtype(Dtype d) {
  return d == Dtype::kI64 || d == Dtype::kI32 || d == Dtype::kI16 || d == Dtype::kI8 ||
         d == Dtype::kU8;
}

// What a file's tensors do not match, gathered so that one error says all.
struct Mismatch {
  std::vector<std::string> problems;    // "tensor 'x': ..." (shape, dtype, twice)
  std::vector<std::string> unexpected;  // in the file, not in the model
  std::vector<std::string> missing;     // in the model, not in the file

  bool empty() const { return problems.empty() && unexpected.empty() && missing.empty(); }

  std::string message(const std::string& path, size_t model_tensors) const {
    std::string text = path + " does not fit the model (" + std::to_string(model_tensors) +
                       " tensors); nothing was loaded:";
    for (const std::string& p : problems) text += "\n  " + p;
    if (!unexpected.empty()) {
      text += "\n  in the file but not in the model (" + std::to_string(unexpected.size()) +
              "): " + listed(unexpected);
    }
    if (!missing.empty()) {
      text += "\n  in the model but not in the file (" + std::to_string(missing.size()) +
              "): " + listed(missing);
    }
    return text + "\n(model.init_skip: [LAYER, ...] leaves layers freshly initialised, e.g. a "
                  "classifier for another number of classes)";
  }
};

// The model tensor a file's name stands for: its name as written (torchvision's
// or vtrain's) or vtrain's own.
std::map<std::string, size_t> name_index(const std::vector<ModelTensor>& tensors) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < tensors.size(); ++i) {
    index[tensors[i].name] = i;
    index[tensors[i].vtrain_name] = i;
  }
  return index;
}

// Whether the file's tensor `entry` fits the model's `want`; if not, says
// why in `mismatch`.
bool fits(const TensorEntry& entry, const ModelTensor& want, Mismatch& mismatch) {
  const std::string where = "tensor '" + entry.name + "'";
  const char* dtype = common::name_of(kDtypeNames, entry.dtype);
  if (want.kind == WeightKind::kBatchCount ? !integer_dtype(entry.dtype)
                                           : entry.dtype != Dtype::kF32) {
    mismatch.problems.push_back(where + ": dtype " + dtype + ", expected " +
                                (want.kind == WeightKind::kBatchCount ? "an integer type" : "F32") +
                                " (torch: convert with .float() before saving)");
    return false;
  }
  if (entry.shape != want.shape) {
    mismatch.problems.push_back(where + ": the file has shape " + shape_text(entry.shape) +
                                ", the model " + shape_text(want.shape) + " (layer " +
                                want.vtrain_name.substr(0, want.vtrain_name.rfind('.')) + ")");
    return false;
  }
  return true;
}

std::vector<float> floats_of(std::span<const std::byte> bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

}  // namespace

std::vector<int> skipped_layers(const worker::Graph& graph, const std::string& preset,
                                const std::vector<std::string>& names) {
  const std::vector<ModelTensor> tensors = model_tensors(graph, preset);
  std::vector<std::string> with_weights;
  for (const ModelTensor& t : tensors) {
    const std::string& layer = graph.layer(t.layer).name;
    if (with_weights.empty() || with_weights.back() != layer) with_weights.push_back(layer);
  }
  const bool torchvision = torchvision_architecture(preset);
  std::vector<int> skip;
  for (const std::string& name : names) {
    int found = -1;
    for (int i = 0; i < graph.size() && found < 0; ++i) {
      const std::string& layer = graph.layer(i).name;
      if (name == layer) found = i;
      if (torchvision && std::find(with_weights.begin(), with_weights.end(), layer) !=
                             with_weights.end() && name == module_name(layer, preset)) {
        found = i;
      }
    }
    const std::string known = " (layers with weights: " + common::join(with_weights) + ")";
    if (found < 0) throw std::invalid_argument("unknown layer '" + name + "'" + known);
    if (std::find(with_weights.begin(), with_weights.end(), graph.layer(found).name) ==
        with_weights.end()) {
      throw std::invalid_argument("layer '" + name + "' has no weights to skip" + known);
    }
    skip.push_back(found);
  }
  return skip;
}

worker::InitialWeights read_initial_weights(const std::string& path, const worker::Graph& graph,
                                            const std::string& preset,
                                            const std::vector<int>& skip) {
  const SafetensorsFile file = SafetensorsFile::read(path);
  const std::vector<ModelTensor> tensors = model_tensors(graph, preset);
  const std::map<std::string, size_t> index = name_index(tensors);
  const auto skipped = [&](const ModelTensor& t) {
    return std::find(skip.begin(), skip.end(), t.layer) != skip.end();
  };
  Mismatch mismatch;
  std::vector<const TensorEntry*> given(tensors.size(), nullptr);
  for (const TensorEntry& entry : file.tensors()) {
    const auto it = index.find(entry.name);
    if (it == index.end()) {
      mismatch.unexpected.push_back(entry.name);
      continue;
    }
    const ModelTensor& want = tensors[it->second];
    if (skipped(want)) continue;
    if (const TensorEntry* first = given[it->second]) {
      mismatch.problems.push_back("tensor '" + want.name + "' is given twice, as '" +
                                  first->name + "' and as '" + entry.name + "'");
      continue;
    }
    if (fits(entry, want, mismatch)) given[it->second] = &entry;
  }
  worker::InitialWeights init;
  int64_t loaded = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ModelTensor& t = tensors[i];
    if (skipped(t) || t.kind == WeightKind::kBatchCount) continue;
    const TensorEntry* entry = given[i];
    if (entry == nullptr) {
      // A tensor the file has but that did not fit is reported as that.
      if (file.find(t.name) == nullptr && file.find(t.vtrain_name) == nullptr) {
        mismatch.missing.push_back(t.name);
      }
      continue;
    }
    std::vector<worker::WeightRange>& ranges =
        t.kind == WeightKind::kParameter ? init.parameters : init.buffers;
    ranges.push_back({t.offset, floats_of(file.bytes(*entry))});
    ++loaded;
  }
  if (!mismatch.empty()) throw WeightsError(mismatch.message(path, tensors.size()));
  std::vector<std::string> skipped_names;
  for (int layer : skip) skipped_names.push_back(graph.layer(layer).name);
  init.note = common::format("model.init: %lld tensors from %s%s%s", static_cast<long long>(loaded),
                             path.c_str(), skip.empty() ? "" : "; freshly initialised: ",
                             common::join(skipped_names).c_str());
  return init;
}

}  // namespace vtrain::model_io
