// Built-in model presets: layer lists for the classic CNNs that Graph::build
// validates like any config-given model.
//
// Every preset builds for its design resolution (224x224, 231x231 for
// OverFeat) and for the small datasets (28x28x1 MNIST, 32x32x3 CIFAR). Two
// rules adapt a preset to a small input, chosen so that the parameter counts
// at 224x224 stay those of the reference models:
//  - Stem: the ImageNet nets whose stem downsamples by 4 or more (alexnet,
//    overfeat, googlenet, resnet*) switch to a CIFAR-style stem when the
//    smaller input side is below kSmallInput: a 3x3 stride-1 pad-1 conv in
//    place of the large strided one; googlenet and resnet also drop the max
//    pools of their stems. The rest of the net is unchanged.
//  - Pools: a pool whose window does not fit its (padded) input map is left
//    out, so deep pool stacks (VGG's five 2x2 pools on 28x28) stop at 1x1.
//    At the design resolution every pool fits, so none is dropped.
// Layers are named as in the Caffe / torchvision models they follow (conv1,
// relu1, pool1, conv3_2, fc6, inception4a.3x3, layer2.0.downsample.conv, ...).
#include <algorithm>
#include <array>
#include <initializer_list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "worker/engine/graph.h"

namespace vtrain::worker {
namespace {

// Inputs with a smaller side below this use the CIFAR-style stem: a stride-4
// stem followed by pools would leave 28x28 or 32x32 maps at 1x1 or less
// before the body of the net.
constexpr int64_t kSmallInput = 64;

// A square conv or pool window.
struct Window {
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t pad = 0;
};

// Appends layers and tracks their per-sample shapes, so that presets can adapt
// to the input size. Graph::build re-checks everything.
class NetBuilder {
 public:
  explicit NetBuilder(const PresetOptions& options) {
    add("data", LayerType::kInput, {});
    shapes_["data"] = {1, options.input.c, options.input.h, options.input.w};
  }

  const Shape& shape(const std::string& name) const { return shapes_.at(name); }

  std::string conv(const std::string& name, const std::string& from, int64_t out, Window w,
                   bool bias = true) {
    LayerSpec& spec = add(name, LayerType::kConv, {from});
    spec.out = out;
    spec.bias = bias;
    set_window(spec, w);
    shapes_[name] = windowed(shape(from), w, out);
    return name;
  }

  std::string relu(const std::string& name, const std::string& from) {
    return same_shape(name, LayerType::kRelu, from);
  }

  std::string batchnorm(const std::string& name, const std::string& from) {
    return same_shape(name, LayerType::kBatchNorm, from);
  }

  std::string pool(const std::string& name, const std::string& from, PoolKind kind, Window w) {
    LayerSpec& spec = add(name, LayerType::kPool, {from});
    spec.pool = kind;
    set_window(spec, w);
    shapes_[name] = windowed(shape(from), w, shape(from).c);
    return name;
  }

  // The pool, or `from` unchanged when the window does not fit the padded map
  // (the small-input rule in the file comment).
  std::string pool_if_fits(const std::string& name, const std::string& from, PoolKind kind,
                           Window w) {
    const Shape& in = shape(from);
    if (w.kernel > std::min(in.h, in.w) + 2 * w.pad) return from;
    return pool(name, from, kind, w);
  }

  std::string global_average_pool(const std::string& name, const std::string& from) {
    LayerSpec& spec = add(name, LayerType::kPool, {from});
    spec.pool = PoolKind::kAverage;
    spec.global = true;
    shapes_[name] = {1, shape(from).c, 1, 1};
    return name;
  }

  std::string fc(const std::string& name, const std::string& from, int64_t out) {
    LayerSpec& spec = add(name, LayerType::kFc, {from});
    spec.out = out;
    shapes_[name] = {1, out, 1, 1};
    return name;
  }

  std::string add_join(const std::string& name, std::vector<std::string> from) {
    const Shape out = shape(from.front());
    add(name, LayerType::kAdd, std::move(from));
    shapes_[name] = out;
    return name;
  }

  std::string concat(const std::string& name, std::vector<std::string> from) {
    Shape out = shape(from.front());
    out.c = 0;
    for (const std::string& f : from) out.c += shape(f).c;
    add(name, LayerType::kConcat, std::move(from));
    shapes_[name] = out;
    return name;
  }

  std::vector<LayerSpec> finish() && { return std::move(layers_); }

 private:
  LayerSpec& add(const std::string& name, LayerType type, std::vector<std::string> inputs) {
    LayerSpec& spec = layers_.emplace_back();
    spec.name = name;
    spec.type = type;
    spec.inputs = std::move(inputs);
    return spec;
  }

  std::string same_shape(const std::string& name, LayerType type, const std::string& from) {
    add(name, type, {from});
    shapes_[name] = shape(from);
    return name;
  }

  static void set_window(LayerSpec& spec, Window w) {
    spec.kernel_h = spec.kernel_w = w.kernel;
    spec.stride_h = spec.stride_w = w.stride;
    spec.pad_h = spec.pad_w = w.pad;
  }

  static Shape windowed(const Shape& in, Window w, int64_t channels) {
    const worker::Window window{w.kernel, w.kernel, w.stride, w.stride, w.pad, w.pad};
    return window.output_shape({1, in.c, in.h, in.w}, channels);
  }

  std::vector<LayerSpec> layers_;
  std::unordered_map<std::string, Shape> shapes_;
};

bool small_input(const PresetOptions& options) {
  return std::min(options.input.h, options.input.w) < kSmallInput;
}

std::string conv_relu(NetBuilder& b, const std::string& suffix, const std::string& from,
                      int64_t out, Window w) {
  return b.relu("relu" + suffix, b.conv("conv" + suffix, from, out, w));
}

// Hidden fc layers with relu, numbered from `first`, then the logits.
std::vector<LayerSpec> classifier(NetBuilder b, std::string x, int first,
                                  std::initializer_list<int64_t> hidden, int64_t classes) {
  int number = first;
  for (int64_t features : hidden) {
    const std::string n = std::to_string(number++);
    x = b.relu("relu" + n, b.fc("fc" + n, x, features));
  }
  b.fc("fc" + std::to_string(number), x, classes);
  return std::move(b).finish();
}

// Caffe's LeNet: no activation after its convolutions.
std::vector<LayerSpec> lenet(const PresetOptions& o) {
  NetBuilder b(o);
  std::string x = b.conv("conv1", "data", 20, {5});
  x = b.pool_if_fits("pool1", x, PoolKind::kMax, {2, 2});
  x = b.conv("conv2", x, 50, {5});
  x = b.pool_if_fits("pool2", x, PoolKind::kMax, {2, 2});
  return classifier(std::move(b), x, 3, {500}, o.classes);
}

struct VggGroup {
  int64_t channels;
  int convs;
};

// Groups of 3x3 pad-1 convs, each with a relu, and a 2x2 max pool after each
// group; then the classifier. Names follow Caffe's VGG: conv<group>_<k>.
std::vector<LayerSpec> vgg(const PresetOptions& o, std::span<const VggGroup> groups,
                           std::initializer_list<int64_t> hidden) {
  NetBuilder b(o);
  std::string x = "data";
  int g = 0;
  for (const VggGroup& group : groups) {
    const std::string gs = std::to_string(++g);
    for (int k = 1; k <= group.convs; ++k) {
      x = conv_relu(b, gs + "_" + std::to_string(k), x, group.channels, {3, 1, 1});
    }
    x = b.pool_if_fits("pool" + gs, x, PoolKind::kMax, {2, 2});
  }
  return classifier(std::move(b), x, g + 1, hidden, o.classes);
}

std::vector<LayerSpec> vgg_small(const PresetOptions& o) {
  constexpr std::array<VggGroup, 2> kGroups = {{{64, 2}, {128, 2}}};
  return vgg(o, kGroups, {256});
}

// VGG-16 (configuration D) deepened as in vDNN (Rhu et al. 2016, Sec. IV-C):
// "Each addition of 100 CONV layers is done by adding 20 more CONV layers to
// each of the five CONV layer groups", with the group's channel count. So
// VGG-(100*h + 16) has 13 + 100*h convs plus the three fc layers: VGG-116 has
// 22-22-23-23-23 convs per group, 113 in all, and 116 weight layers.
std::vector<LayerSpec> vgg_deepened(const PresetOptions& o, int hundreds) {
  const int extra = 20 * hundreds;
  const std::array<VggGroup, 5> groups = {
      {{64, 2 + extra}, {128, 2 + extra}, {256, 3 + extra}, {512, 3 + extra}, {512, 3 + extra}}};
  return vgg(o, groups, {4096, 4096});
}

// torchvision's AlexNet without dropout. Its adaptive average pool to 6x6 is
// left out: at 224x224 the map already is 6x6, and elsewhere fc6 takes the
// map as it is. Small inputs: conv1 becomes 3x3 stride 1 pad 1.
std::vector<LayerSpec> alexnet(const PresetOptions& o) {
  NetBuilder b(o);
  const Window stem = small_input(o) ? Window{3, 1, 1} : Window{11, 4, 2};
  std::string x = conv_relu(b, "1", "data", 64, stem);
  x = b.pool_if_fits("pool1", x, PoolKind::kMax, {3, 2});
  x = conv_relu(b, "2", x, 192, {5, 1, 2});
  x = b.pool_if_fits("pool2", x, PoolKind::kMax, {3, 2});
  x = conv_relu(b, "3", x, 384, {3, 1, 1});
  x = conv_relu(b, "4", x, 256, {3, 1, 1});
  x = conv_relu(b, "5", x, 256, {3, 1, 1});
  x = b.pool_if_fits("pool5", x, PoolKind::kMax, {3, 2});
  return classifier(std::move(b), x, 6, {4096, 4096}, o.classes);
}

// OverFeat's fast model (Sermanet et al. 2014, Table 1), designed for 231x231
// (conv5 maps 12x12, pool5 6x6); at 224 pool5 gives 5x5. Small inputs: conv1
// becomes 3x3 stride 1 pad 1.
std::vector<LayerSpec> overfeat(const PresetOptions& o) {
  NetBuilder b(o);
  const Window stem = small_input(o) ? Window{3, 1, 1} : Window{11, 4, 0};
  std::string x = conv_relu(b, "1", "data", 96, stem);
  x = b.pool_if_fits("pool1", x, PoolKind::kMax, {2, 2});
  x = conv_relu(b, "2", x, 256, {5});
  x = b.pool_if_fits("pool2", x, PoolKind::kMax, {2, 2});
  x = conv_relu(b, "3", x, 512, {3, 1, 1});
  x = conv_relu(b, "4", x, 1024, {3, 1, 1});
  x = conv_relu(b, "5", x, 1024, {3, 1, 1});
  x = b.pool_if_fits("pool5", x, PoolKind::kMax, {2, 2});
  return classifier(std::move(b), x, 6, {3072, 4096}, o.classes);
}

// Output channels of one Inception module's branches.
struct InceptionChannels {
  const char* name;
  int64_t c1x1, c3x3_reduce, c3x3, c5x5_reduce, c5x5, pool_proj;
};

std::string inception(NetBuilder& b, const InceptionChannels& c, const std::string& from) {
  const std::string p = std::string(c.name) + ".";
  auto unit = [&](const std::string& what, const std::string& in, int64_t out, Window w) {
    return b.relu(p + "relu_" + what, b.conv(p + what, in, out, w));
  };
  const std::string b1 = unit("1x1", from, c.c1x1, {1});
  const std::string b2 =
      unit("3x3", unit("3x3_reduce", from, c.c3x3_reduce, {1}), c.c3x3, {3, 1, 1});
  const std::string b3 =
      unit("5x5", unit("5x5_reduce", from, c.c5x5_reduce, {1}), c.c5x5, {5, 1, 2});
  const std::string pooled = b.pool(p + "pool", from, PoolKind::kMax, {3, 1, 1});
  const std::string b4 = unit("pool_proj", pooled, c.pool_proj, {1});
  return b.concat(p + "output", {b1, b2, b3, b4});
}

// GoogLeNet / Inception v1 as in the paper (Szegedy et al. 2015, Table 1):
// no batch norm, 5x5 convs in the third branch (torchvision uses 3x3 there),
// no LRN, no auxiliary heads, no dropout. torchvision's ceil-mode 3x3/2 max
// pools are written as pad-1 floor-mode pools, which give the same map sizes
// (112 -> 56 -> 28 -> 14 at 224x224). Small inputs: conv1 becomes 3x3 stride 1
// pad 1 and the two stem pools go, so inception3a sees the full input size.
std::vector<LayerSpec> googlenet(const PresetOptions& o) {
  constexpr std::array<InceptionChannels, 9> kModules = {{
      {"inception3a", 64, 96, 128, 16, 32, 32},
      {"inception3b", 128, 128, 192, 32, 96, 64},
      {"inception4a", 192, 96, 208, 16, 48, 64},
      {"inception4b", 160, 112, 224, 24, 64, 64},
      {"inception4c", 128, 128, 256, 24, 64, 64},
      {"inception4d", 112, 144, 288, 32, 64, 64},
      {"inception4e", 256, 160, 320, 32, 128, 128},
      {"inception5a", 256, 160, 320, 32, 128, 128},
      {"inception5b", 384, 192, 384, 48, 128, 128},
  }};
  const bool small = small_input(o);
  NetBuilder b(o);
  std::string x = conv_relu(b, "1", "data", 64, small ? Window{3, 1, 1} : Window{7, 2, 3});
  if (!small) x = b.pool_if_fits("pool1", x, PoolKind::kMax, {3, 2, 1});
  x = conv_relu(b, "2", x, 64, {1});
  x = conv_relu(b, "3", x, 192, {3, 1, 1});
  if (!small) x = b.pool_if_fits("pool2", x, PoolKind::kMax, {3, 2, 1});
  for (const InceptionChannels& module : kModules) {
    x = inception(b, module, x);
    if (module.name == std::string_view("inception3b")) {
      x = b.pool_if_fits("pool3", x, PoolKind::kMax, {3, 2, 1});
    } else if (module.name == std::string_view("inception4e")) {
      x = b.pool_if_fits("pool4", x, PoolKind::kMax, {2, 2});
    }
  }
  x = b.global_average_pool("avgpool", x);
  b.fc("fc", x, o.classes);
  return std::move(b).finish();
}

// conv (no bias: the batch norm's shift replaces it) + batch norm.
std::string conv_bn(NetBuilder& b, const std::string& prefix, const std::string& suffix,
                    const std::string& from, int64_t out, Window w) {
  return b.batchnorm(prefix + "bn" + suffix, b.conv(prefix + "conv" + suffix, from, out, w, false));
}

// The identity, or torchvision's 1x1 strided projection where the block
// changes the shape.
std::string shortcut(NetBuilder& b, const std::string& prefix, const std::string& from, int64_t out,
                     int64_t stride) {
  if (stride == 1 && b.shape(from).c == out) return from;
  const std::string p = prefix + "downsample.";
  return b.batchnorm(p + "bn", b.conv(p + "conv", from, out, {1, stride, 0}, false));
}

std::string basic_block(NetBuilder& b, const std::string& prefix, const std::string& from,
                        int64_t planes, int64_t stride) {
  std::string y = b.relu(prefix + "relu1", conv_bn(b, prefix, "1", from, planes, {3, stride, 1}));
  y = conv_bn(b, prefix, "2", y, planes, {3, 1, 1});
  const std::string sc = shortcut(b, prefix, from, planes, stride);
  return b.relu(prefix + "relu", b.add_join(prefix + "add", {y, sc}));
}

// torchvision's (v1.5) bottleneck: the stride sits on the 3x3 conv.
std::string bottleneck_block(NetBuilder& b, const std::string& prefix, const std::string& from,
                             int64_t planes, int64_t stride) {
  constexpr int64_t kExpansion = 4;
  std::string y = b.relu(prefix + "relu1", conv_bn(b, prefix, "1", from, planes, {1}));
  y = b.relu(prefix + "relu2", conv_bn(b, prefix, "2", y, planes, {3, stride, 1}));
  y = conv_bn(b, prefix, "3", y, planes * kExpansion, {1});
  const std::string sc = shortcut(b, prefix, from, planes * kExpansion, stride);
  return b.relu(prefix + "relu", b.add_join(prefix + "add", {y, sc}));
}

using Block = std::string (*)(NetBuilder&, const std::string&, const std::string&, int64_t,
                              int64_t);

// torchvision's ResNet: layer1..layer4 of 64..512 planes, the first block of
// layer2..4 downsampling by 2. Small inputs: CIFAR stem, conv1 3x3 stride 1
// pad 1 and no max pool.
std::vector<LayerSpec> resnet(const PresetOptions& o, Block block, std::array<int, 4> blocks) {
  const bool small = small_input(o);
  NetBuilder b(o);
  std::string x = conv_bn(b, "", "1", "data", 64, small ? Window{3, 1, 1} : Window{7, 2, 3});
  x = b.relu("relu1", x);
  if (!small) x = b.pool_if_fits("maxpool", x, PoolKind::kMax, {3, 2, 1});
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t planes = int64_t{64} << stage;
    for (int k = 0; k < blocks[stage]; ++k) {
      const std::string prefix =
          "layer" + std::to_string(stage + 1) + "." + std::to_string(k) + ".";
      x = block(b, prefix, x, planes, stage > 0 && k == 0 ? 2 : 1);
    }
  }
  x = b.global_average_pool("avgpool", x);
  b.fc("fc", x, o.classes);
  return std::move(b).finish();
}

std::vector<LayerSpec> resnet18(const PresetOptions& o) {
  return resnet(o, basic_block, {2, 2, 2, 2});
}

std::vector<LayerSpec> resnet50(const PresetOptions& o) {
  return resnet(o, bottleneck_block, {3, 4, 6, 3});
}

struct Preset {
  const char* name;
  std::vector<LayerSpec> (*build)(const PresetOptions&);
};

constexpr std::array<Preset, 12> kPresets = {{
    {"lenet", lenet},
    {"vgg-small", vgg_small},
    {"alexnet", alexnet},
    {"overfeat", overfeat},
    {"googlenet", googlenet},
    {"vgg16", [](const PresetOptions& o) { return vgg_deepened(o, 0); }},
    {"vgg116", [](const PresetOptions& o) { return vgg_deepened(o, 1); }},
    {"vgg216", [](const PresetOptions& o) { return vgg_deepened(o, 2); }},
    {"vgg316", [](const PresetOptions& o) { return vgg_deepened(o, 3); }},
    {"vgg416", [](const PresetOptions& o) { return vgg_deepened(o, 4); }},
    {"resnet18", resnet18},
    {"resnet50", resnet50},
}};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

std::vector<LayerSpec> preset_layers(const std::string& name, const PresetOptions& options) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    const Shape& in = options.input;
    if (in.c <= 0 || in.h <= 0 || in.w <= 0) {
      throw GraphError("model preset '" + name + "': input shape must be positive, got " +
                       std::to_string(in.c) + "x" + std::to_string(in.h) + "x" +
                       std::to_string(in.w));
    }
    if (options.classes <= 0) {
      throw GraphError("model preset '" + name + "': classes must be positive, got " +
                       std::to_string(options.classes));
    }
    return p.build(options);
  }
  std::string known;
  for (const Preset& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  throw GraphError("unknown model preset '" + name + "' (known: " + known + ")");
}

}  // namespace vtrain::worker
