// Graph validation, ordering, shapes, signatures and the model presets.
#include "worker/engine/graph.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace vtrain::worker {
namespace {

// Whether `text` contains `part`, showing both when it does not.
::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

LayerSpec input_layer(const std::string& name = "data") {
  LayerSpec s;
  s.name = name;
  s.type = LayerType::kInput;
  return s;
}

LayerSpec conv(const std::string& name, const std::string& from, int64_t out, int64_t kernel,
               int64_t stride = 1, int64_t pad = 0) {
  LayerSpec s;
  s.name = name;
  s.type = LayerType::kConv;
  s.inputs = {from};
  s.out = out;
  s.kernel_h = s.kernel_w = kernel;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

LayerSpec pool(const std::string& name, const std::string& from, int64_t kernel, int64_t stride,
               int64_t pad = 0) {
  LayerSpec s = conv(name, from, 0, kernel, stride, pad);
  s.type = LayerType::kPool;
  return s;
}

LayerSpec unary(const std::string& name, LayerType type, const std::string& from) {
  LayerSpec s;
  s.name = name;
  s.type = type;
  s.inputs = {from};
  return s;
}

LayerSpec fc(const std::string& name, const std::string& from, int64_t out) {
  LayerSpec s = unary(name, LayerType::kFc, from);
  s.out = out;
  return s;
}

LayerSpec join(const std::string& name, LayerType type, std::vector<std::string> from) {
  LayerSpec s;
  s.name = name;
  s.type = type;
  s.inputs = std::move(from);
  return s;
}

const Shape kImage{1, 3, 8, 8};

// The error message of building `layers`, or "" when it builds.
std::string build_error(std::vector<LayerSpec> layers, const Shape& input = kImage) {
  try {
    Graph::build(std::move(layers), input);
  } catch (const GraphError& e) {
    return e.what();
  }
  return "";
}

// A fork/join net: stem feeds three layers, a joins and feeds a concat.
// Listed backwards, so that every layer comes before its inputs.
std::vector<LayerSpec> fork_join_reversed() {
  return {
      fc("head", "cat", 10),                          // 0
      join("cat", LayerType::kConcat, {"sum", "a"}),  // 1
      join("sum", LayerType::kAdd, {"a", "b", "c"}),  // 2
      unary("c", LayerType::kBatchNorm, "stem"),      // 3
      conv("b", "stem", 8, 3, 1, 1),                  // 4
      unary("a", LayerType::kRelu, "stem"),           // 5
      conv("stem", "data", 8, 3, 1, 1),               // 6
      input_layer(),                                  // 7
  };
}

std::vector<std::string> names(const Graph& g) {
  std::vector<std::string> out;
  for (const LayerSpec& s : g.layers()) out.push_back(s.name);
  return out;
}

TEST(LayerType, NamesRoundTrip) {
  for (size_t i = 0; i < kLayerTypeCount; ++i) {
    const LayerType t = static_cast<LayerType>(i);
    EXPECT_EQ(parse_layer_type(layer_type_name(t)), t);
  }
}

TEST(LayerType, UnknownNameListsKnownOnes) {
  try {
    parse_layer_type("swish");
    FAIL() << "expected GraphError";
  } catch (const GraphError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown layer type 'swish' (known: input, conv, relu, pool, fc, batchnorm, "
                 "add, concat, silu, gelu, sigmoid, relu6, mul, dropout)");
  }
}

TEST(Graph, OrdersForkJoinTopologicallyAndStably) {
  const Graph g = Graph::build(fork_join_reversed(), kImage);
  // Among ready layers the earliest listed goes first: c (3) before b (4) before a (5).
  EXPECT_EQ(names(g),
            (std::vector<std::string>{"data", "stem", "c", "b", "a", "sum", "cat", "head"}));
  EXPECT_EQ(g.input_index(), 0);
  EXPECT_EQ(g.sink_index(), 7);
  EXPECT_EQ(g.find("sum"), 5);
  EXPECT_EQ(g.find("nope"), -1);
  // Input indices follow the spec's order, remapped to the new positions.
  EXPECT_EQ(g.inputs(g.find("sum")), (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(g.inputs(g.find("cat")), (std::vector<int>{5, 4}));
  EXPECT_TRUE(g.inputs(0).empty());
}

TEST(Graph, KeepsAnOrderedListAsGiven) {
  std::vector<LayerSpec> layers = fork_join_reversed();
  std::reverse(layers.begin(), layers.end());
  const Graph g = Graph::build(layers, kImage);
  EXPECT_EQ(names(g),
            (std::vector<std::string>{"data", "stem", "a", "b", "c", "sum", "cat", "head"}));
}

TEST(Graph, CountsConsumers) {
  const Graph g = Graph::build(fork_join_reversed(), kImage);
  const int stem = g.find("stem");
  EXPECT_EQ(g.consumer_count(stem), 3);
  EXPECT_EQ(g.consumers(stem), (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(g.consumers(g.find("a")), (std::vector<int>{5, 6}));
  EXPECT_EQ(g.consumer_count(g.find("data")), 1);
  EXPECT_EQ(g.consumer_count(g.find("sum")), 1);
  EXPECT_EQ(g.consumer_count(g.sink_index()), 0);
}

TEST(Graph, InfersShapes) {
  const Graph g = Graph::build(fork_join_reversed(), kImage);
  EXPECT_EQ(g.output_shape(0), (Shape{1, 3, 8, 8}));
  EXPECT_EQ(g.output_shape(g.find("stem")), (Shape{1, 8, 8, 8}));
  EXPECT_EQ(g.output_shape(g.find("sum")), (Shape{1, 8, 8, 8}));
  EXPECT_EQ(g.output_shape(g.find("cat")), (Shape{1, 16, 8, 8}));
  EXPECT_EQ(g.output_shape(g.sink_index()), (Shape{1, 10, 1, 1}));
  EXPECT_EQ(g.classes(), 10);
}

TEST(Graph, InfersWindowShapes) {
  LayerSpec wide = conv("wide", "data", 4, 3, 2, 1);
  wide.kernel_w = 5;
  wide.pad_w = 0;
  const Graph g = Graph::build(
      {input_layer(), wide, pool("pool", "wide", 3, 2), fc("fc", "pool", 2)}, Shape{1, 3, 9, 13});
  // h: (9 + 2 - 3) / 2 + 1 = 5; w: (13 - 5) / 2 + 1 = 5; pool: (5 - 3) / 2 + 1 = 2.
  EXPECT_EQ(g.output_shape(1), (Shape{1, 4, 5, 5}));
  EXPECT_EQ(g.output_shape(2), (Shape{1, 4, 2, 2}));
}

TEST(Graph, GlobalPoolCoversTheInputPlane) {
  LayerSpec gap = pool("gap", "conv", 99, 7, 3);
  gap.global = true;
  gap.pool = PoolKind::kAverage;
  const Graph g = Graph::build({input_layer(), conv("conv", "data", 6, 3), gap, fc("fc", "gap", 4)},
                               Shape{1, 3, 7, 9});
  const LayerSpec& s = g.layer(g.find("gap"));
  EXPECT_EQ(g.output_shape(g.find("gap")), (Shape{1, 6, 1, 1}));
  EXPECT_EQ(s.kernel_h, 5);
  EXPECT_EQ(s.kernel_w, 7);
  EXPECT_EQ(s.stride_h, 1);
  EXPECT_EQ(s.stride_w, 1);
  EXPECT_EQ(s.pad_h, 0);
  EXPECT_EQ(s.pad_w, 0);
}

TEST(Graph, CountsParameters) {
  LayerSpec nobias = conv("c2", "bn", 5, 1);
  nobias.bias = false;
  const Graph g =
      Graph::build({input_layer(), conv("c1", "data", 4, 3),
                    unary("bn", LayerType::kBatchNorm, "c1"), nobias, fc("fc", "c2", 7)},
                   kImage);
  const int64_t c1 = 4 * 3 * 3 * 3 + 4;
  const int64_t bn = 2 * 4;
  const int64_t c2 = 5 * 4;
  const int64_t head = 7 * 5 * 6 * 6 + 7;
  EXPECT_EQ(g.parameter_count(), c1 + bn + c2 + head);
}

// ---------------------------------------------------------------- errors

TEST(GraphErrors, UnknownInputNamesLayerLineAndKnownNames) {
  LayerSpec bad = fc("fc1", "pool9", 10);
  bad.source_line = 12;
  EXPECT_EQ(build_error({input_layer(), conv("conv1", "data", 4, 3), bad}),
            "layer 'fc1' (line 12): input 'pool9' is not a layer (known: data, conv1, fc1)");
}

TEST(GraphErrors, OmitsLineWhenUnknown) {
  EXPECT_EQ(build_error({input_layer(), fc("fc1", "nope", 10)}),
            "layer 'fc1': input 'nope' is not a layer (known: data, fc1)");
}

TEST(GraphErrors, DuplicateName) {
  LayerSpec first = conv("conv1", "data", 4, 3);
  first.source_line = 3;
  LayerSpec second = conv("conv1", "data", 4, 3);
  second.source_line = 7;
  EXPECT_EQ(build_error({input_layer(), first, second}),
            "layer 'conv1' (line 7): duplicate name (first defined at line 3)");
}

TEST(GraphErrors, EmptyName) {
  EXPECT_TRUE(Contains(build_error({input_layer(), conv("", "data", 4, 3)}), "has no name"));
}

TEST(GraphErrors, CycleNamesItsLayers) {
  const std::string error = build_error({input_layer(), join("a", LayerType::kAdd, {"data", "c"}),
                                         unary("b", LayerType::kRelu, "a"),
                                         unary("c", LayerType::kRelu, "b"), fc("fc", "c", 2)});
  EXPECT_TRUE(Contains(error, "cycle"));
  EXPECT_TRUE(Contains(error, "a -> b -> c -> a"));
}

TEST(GraphErrors, SelfLoopIsACycle) {
  EXPECT_TRUE(Contains(
      build_error({input_layer(), join("a", LayerType::kAdd, {"data", "a"}), fc("fc", "a", 2)}),
      "cycle: a -> a"));
}

TEST(GraphErrors, WrongInputCounts) {
  EXPECT_EQ(build_error({input_layer(), join("r", LayerType::kRelu, {"data", "data2"})}),
            "layer 'r': relu takes exactly 1 input(s), got 2");
  EXPECT_EQ(build_error({input_layer(), join("sum", LayerType::kAdd, {"data"})}),
            "layer 'sum': add takes at least 2 input(s), got 1");
  EXPECT_EQ(build_error({input_layer(), join("cat", LayerType::kConcat, {"data"})}),
            "layer 'cat': concat takes at least 2 input(s), got 1");
  LayerSpec fed_input = input_layer("x");
  fed_input.inputs = {"data"};
  EXPECT_EQ(build_error({input_layer(), fed_input}),
            "layer 'x': input takes exactly 0 input(s), got 1");
  LayerSpec orphan = conv("c", "data", 4, 3);
  orphan.inputs.clear();
  EXPECT_EQ(build_error({input_layer(), orphan}),
            "layer 'c': conv takes exactly 1 input(s), got 0");
}

TEST(GraphErrors, DuplicateInputInOneLayer) {
  EXPECT_EQ(build_error({input_layer(), join("sum", LayerType::kAdd, {"data", "data"})}),
            "layer 'sum': input 'data' is listed twice");
}

TEST(GraphErrors, InputLayerCount) {
  EXPECT_EQ(build_error({}), "graph has no input layer (type input, no inputs)");
  EXPECT_EQ(build_error(
                {input_layer("a"), input_layer("b"), join("cat", LayerType::kConcat, {"a", "b"})}),
            "graph has 2 input layers ('a', 'b'); exactly one is required");
  EXPECT_EQ(build_error({input_layer()}), "graph has only the input layer 'data'");
}

TEST(GraphErrors, NonPositiveSizes) {
  EXPECT_EQ(build_error({input_layer(), conv("c", "data", 0, 3)}),
            "layer 'c': out must be positive, got 0");
  EXPECT_EQ(build_error({input_layer(), fc("f", "data", -2)}),
            "layer 'f': out must be positive, got -2");
  EXPECT_EQ(build_error({input_layer(), conv("c", "data", 4, 0)}),
            "layer 'c': kernel must be positive, got 0x0");
  EXPECT_EQ(build_error({input_layer(), pool("p", "data", 2, 0)}),
            "layer 'p': stride must be positive, got 0x0");
}

TEST(GraphErrors, BadPadding) {
  EXPECT_EQ(build_error({input_layer(), conv("c", "data", 4, 3, 1, -1)}),
            "layer 'c': pad must not be negative, got -1x-1");
  LayerSpec c = conv("c", "data", 4, 3, 1, 1);
  c.pad_w = 3;
  EXPECT_EQ(build_error({input_layer(), c}),
            "layer 'c': pad 1x3 must be smaller than the kernel 3x3");
}

TEST(GraphErrors, WindowLargerThanPaddedInput) {
  LayerSpec c = conv("c", "data", 4, 11, 4, 2);
  c.source_line = 5;
  EXPECT_EQ(build_error({input_layer(), c, fc("f", "c", 2)}, Shape{1, 3, 6, 6}),
            "layer 'c' (line 5): 11x11 window (pad 2x2) is larger than its padded input 3x6x6 "
            "from 'data'");
  EXPECT_TRUE(Contains(
      build_error({input_layer(), pool("p", "data", 3, 2), fc("f", "p", 2)}, Shape{1, 3, 2, 9}),
      "layer 'p': 3x3 window (pad 0x0) is larger than its padded input 3x2x9"));
}

TEST(GraphErrors, AddShapeMismatchShowsShapes) {
  EXPECT_EQ(
      build_error({input_layer(), conv("a", "data", 8, 3, 1, 1), conv("b", "data", 8, 3, 2, 1),
                   join("sum", LayerType::kAdd, {"a", "b"}), fc("f", "sum", 2)}),
      "layer 'sum': add needs identical input shapes, got a 8x8x8, b 8x4x4");
  EXPECT_TRUE(Contains(build_error({input_layer(), conv("a", "data", 8, 1), conv("b", "data", 4, 1),
                                    join("sum", LayerType::kAdd, {"a", "b"}), fc("f", "sum", 2)}),
                       "a 8x8x8, b 4x8x8"));
}

TEST(GraphErrors, ConcatSpatialMismatchShowsShapes) {
  EXPECT_EQ(build_error({input_layer(), conv("a", "data", 8, 3), conv("b", "data", 4, 1),
                         join("cat", LayerType::kConcat, {"a", "b"}), fc("f", "cat", 2)}),
            "layer 'cat': concat needs equal spatial sizes, got a 8x6x6, b 4x8x8");
}

TEST(GraphErrors, SeveralSinks) {
  const std::string error = build_error({input_layer(), conv("c", "data", 4, 3), fc("head", "c", 2),
                                         unary("dangling", LayerType::kRelu, "c")});
  EXPECT_TRUE(Contains(error, "graph has 2 sinks ('head', 'dangling')"));
  EXPECT_TRUE(Contains(error, "exactly one layer, the logits, may have no consumers"));
}

// ------------------------------------------------------------- signature

TEST(Graph, SignatureIsDeterministicAndIgnoresNames) {
  const std::string a = Graph::build(fork_join_reversed(), kImage).signature();
  EXPECT_EQ(a, Graph::build(fork_join_reversed(), kImage).signature());
  EXPECT_FALSE(a.empty());

  std::vector<LayerSpec> renamed = fork_join_reversed();
  for (LayerSpec& s : renamed) {
    s.name = "x_" + s.name;
    for (std::string& in : s.inputs) in = "x_" + in;
    s.source_line = 42;
  }
  EXPECT_EQ(a, Graph::build(renamed, kImage).signature());
}

TEST(Graph, SignatureChangesWithEveryParameter) {
  const std::string base = Graph::build(fork_join_reversed(), kImage).signature();
  auto changed = [&](auto edit, const Shape& input = kImage) {
    std::vector<LayerSpec> layers = fork_join_reversed();
    edit(layers);
    return Graph::build(layers, input).signature();
  };
  // Index 4 is conv "b", 3 is batchnorm "c", 0 is fc "head".
  std::set<std::string> seen{base};
  const std::vector<std::string> variants = {
      changed([](auto& l) { l[0].out = 11; }),
      changed([](auto& l) { l[0].bias = false; }),
      changed([](auto& l) { l[4].bias = false; }),
      changed([](auto& l) {
        l[4].kernel_w = 1;
        l[4].pad_w = 0;
      }),
      changed([](auto& l) {
        l[4].kernel_h = l[4].kernel_w = 5;
        l[4].pad_h = l[4].pad_w = 2;
      }),
      changed([](auto& l) { l[3].bn_eps = 1e-3f; }),
      changed([](auto& l) { l[3].bn_momentum = 0.01f; }),
      changed([](auto& l) {
        l[2].inputs = {"a", "c", "b"};
      }),
      changed([](auto& l) { l[2].type = LayerType::kConcat; }),
      changed([](auto&) {}, Shape{1, 3, 9, 9}),
      changed([](auto&) {}, Shape{1, 1, 8, 8}),
  };
  for (const std::string& v : variants) EXPECT_TRUE(seen.insert(v).second) << v;
}

// ------------------------------------------ grouped conv, activations, mul, dropout

LayerSpec grouped(const std::string& name, const std::string& from, int64_t out, int64_t groups) {
  LayerSpec s = conv(name, from, out, 3, 1, 1);
  s.groups = groups;
  return s;
}

LayerSpec mul(const std::string& name, const std::string& a, const std::string& b) {
  return join(name, LayerType::kMul, {a, b});
}

LayerSpec dropout(const std::string& name, const std::string& from, float p) {
  LayerSpec s = unary(name, LayerType::kDropout, from);
  s.dropout_p = p;
  return s;
}

TEST(NewLayers, ActivationsAndDropoutKeepTheShape) {
  std::vector<LayerSpec> layers = {input_layer(), conv("c", "data", 4, 3, 1, 1)};
  std::string from = "c";
  for (LayerType t : {LayerType::kSilu, LayerType::kGelu, LayerType::kSigmoid, LayerType::kRelu6}) {
    layers.push_back(unary(layer_type_name(t), t, from));
    from = layer_type_name(t);
  }
  layers.push_back(dropout("drop", from, 0.2f));
  layers.push_back(fc("fc", "drop", 3));
  const Graph g = Graph::build(layers, kImage);
  for (const char* name : {"silu", "gelu", "sigmoid", "relu6", "drop"}) {
    EXPECT_EQ(g.output_shape(g.find(name)), (Shape{1, 4, 8, 8})) << name;
  }
  EXPECT_EQ(g.parameter_count(), 4 * 3 * 9 + 4 + 3 * 4 * 64 + 3);
}

TEST(NewLayers, GroupedConvCountsOneGroupsInputsPerOutput) {
  // 6 -> 12 channels in 3 groups: each output reads 2 inputs; depthwise 12 -> 12.
  const Graph g = Graph::build({input_layer(), conv("c", "data", 6, 1), grouped("g", "c", 12, 3),
                                grouped("dw", "g", 12, 12), fc("fc", "dw", 2)},
                               kImage);
  EXPECT_EQ(g.output_shape(g.find("dw")), (Shape{1, 12, 8, 8}));
  EXPECT_EQ(g.layer_parameter_count(g.find("g")), 12 * 2 * 9 + 12);
  EXPECT_EQ(g.layer_parameter_count(g.find("dw")), 12 * 1 * 9 + 12);
  EXPECT_EQ(g.parameter_count(), (6 * 3 + 6) + (12 * 2 * 9 + 12) + (12 * 9 + 12) +
                                     (2 * 12 * 64 + 2));
}

TEST(NewLayers, GroupsMustDivideBothChannelCounts) {
  EXPECT_EQ(build_error({input_layer(), conv("c", "data", 6, 1), grouped("g", "c", 8, 4),
                         fc("fc", "g", 2)}),
            "layer 'g': groups 4 must divide the input channels, got 6x8x8 from 'c'");
  EXPECT_EQ(build_error({input_layer(), conv("c", "data", 6, 1), grouped("g", "c", 9, 2),
                         fc("fc", "g", 2)}),
            "layer 'g': groups must be positive and divide out 9, got 2");
  LayerSpec zero = grouped("g", "c", 6, 0);
  zero.source_line = 7;
  EXPECT_EQ(build_error({input_layer(), conv("c", "data", 6, 1), zero, fc("fc", "g", 2)}),
            "layer 'g' (line 7): groups must be positive and divide out 6, got 0");
}

TEST(NewLayers, MulBroadcastsAPerChannelGate) {
  // Squeeze-excitation: x * sigmoid(fc2(pool(x))), the gate 4x1x1.
  LayerSpec gap = pool("gap", "x", 8, 1);
  gap.global = true;
  gap.pool = PoolKind::kAverage;
  const Graph g = Graph::build({input_layer(), conv("x", "data", 4, 3, 1, 1), gap,
                                conv("fc2", "gap", 4, 1), unary("gate", LayerType::kSigmoid, "fc2"),
                                mul("se", "x", "gate"), mul("sq", "se", "x"), fc("fc", "sq", 2)},
                               kImage);
  EXPECT_EQ(g.output_shape(g.find("se")), (Shape{1, 4, 8, 8}));
  EXPECT_EQ(g.output_shape(g.find("sq")), (Shape{1, 4, 8, 8}));
  EXPECT_EQ(g.inputs(g.find("se")), (std::vector<int>{g.find("x"), g.find("gate")}));
}

TEST(NewLayers, MulRefusesShapesThatDoNotBroadcast) {
  LayerSpec gap = pool("gap", "x", 8, 1);
  gap.global = true;
  LayerSpec bad = mul("m", "gap", "x");  // the broadcast factor must come second
  bad.source_line = 12;
  EXPECT_EQ(build_error({input_layer(), conv("x", "data", 4, 3, 1, 1), gap, bad, fc("fc", "m", 2)}),
            "layer 'm' (line 12): mul needs its second input shaped like the first or 4x1x1 (one "
            "value per channel), got gap 4x1x1, x 4x8x8");
  EXPECT_EQ(build_error({input_layer(), conv("x", "data", 4, 3, 1, 1), conv("y", "data", 5, 3, 1, 1),
                         mul("m", "x", "y"), fc("fc", "m", 2)}),
            "layer 'm': mul needs its second input shaped like the first or 4x1x1 (one value per "
            "channel), got x 4x8x8, y 5x8x8");
  EXPECT_EQ(build_error({input_layer(), conv("x", "data", 4, 3, 1, 1),
                         join("m", LayerType::kMul, {"x"}), fc("fc", "m", 2)}),
            "layer 'm': mul takes exactly 2 input(s), got 1");
}

TEST(NewLayers, DropoutProbabilityIsInZeroToOne) {
  for (float p : {0.0f, 0.5f, 0.999f}) {
    EXPECT_EQ(build_error({input_layer(), dropout("d", "data", p), fc("fc", "d", 2)}), "") << p;
  }
  EXPECT_EQ(build_error({input_layer(), dropout("d", "data", 1.0f), fc("fc", "d", 2)}),
            "layer 'd': p must be in [0, 1), got 1.000000");
  EXPECT_EQ(build_error({input_layer(), dropout("d", "data", -0.1f), fc("fc", "d", 2)}),
            "layer 'd': p must be in [0, 1), got -0.100000");
}

TEST(NewLayers, SignatureShowsGroupsDropoutAndActivation) {
  auto signature = [](const std::vector<LayerSpec>& layers) {
    return Graph::build(layers, kImage).signature();
  };
  auto net = [](LayerSpec middle) {
    return std::vector<LayerSpec>{input_layer(), conv("c", "data", 4, 3, 1, 1), std::move(middle),
                                  fc("fc", "m", 2)};
  };
  const std::string plain = signature(net(grouped("m", "c", 4, 1)));
  EXPECT_NE(signature(net(grouped("m", "c", 4, 2))), plain);
  EXPECT_NE(signature(net(grouped("m", "c", 4, 4))), signature(net(grouped("m", "c", 4, 2))));
  EXPECT_NE(signature(net(dropout("m", "c", 0.1f))), signature(net(dropout("m", "c", 0.2f))));
  EXPECT_NE(signature(net(unary("m", LayerType::kSilu, "c"))),
            signature(net(unary("m", LayerType::kGelu, "c"))));
  // groups = 1 leaves an ungrouped conv's signature (and the checkpoints
  // and perf-DB rows keyed on it) as it was: this is main's value.
  EXPECT_EQ(signature({input_layer(), conv("c", "data", 4, 3, 1, 1), fc("fc", "c", 2)}),
            "ee67ea0674e456fb");
}

// --------------------------------------------------------------- presets

struct PresetCase {
  Shape input;
  int64_t classes;
};

class PresetBuilds : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetBuilds, ForMnistCifarAndImageNetSizes) {
  for (const PresetCase& c : {PresetCase{{1, 1, 28, 28}, 10}, PresetCase{{1, 3, 32, 32}, 10},
                              PresetCase{{1, 3, 224, 224}, 1000}}) {
    SCOPED_TRACE(c.input.str());
    const Graph g = Graph::build(preset_layers(GetParam(), {c.input, c.classes}), c.input);
    EXPECT_EQ(g.layer(0).type, LayerType::kInput);
    EXPECT_EQ(g.output_shape(0), c.input);
    EXPECT_EQ(g.output_shape(g.sink_index()), (Shape{1, c.classes, 1, 1}));
    EXPECT_EQ(g.classes(), c.classes);
    // Presets are listed in a valid order already.
    const std::vector<LayerSpec> listed = preset_layers(GetParam(), {c.input, c.classes});
    for (int i = 0; i < g.size(); ++i) ASSERT_EQ(g.layer(i).name, listed[i].name);
  }
}

INSTANTIATE_TEST_SUITE_P(All, PresetBuilds, ::testing::ValuesIn(preset_names()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

Graph imagenet_preset(const std::string& name, int64_t side = 224) {
  const Shape input{1, 3, side, side};
  return Graph::build(preset_layers(name, {input, 1000}), input);
}

int count_layers(const Graph& g, LayerType type) {
  return static_cast<int>(std::count_if(g.layers().begin(), g.layers().end(),
                                        [&](const LayerSpec& s) { return s.type == type; }));
}

TEST(Presets, NamesAreStableAndComplete) {
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"lenet", "vgg-small", "alexnet", "overfeat",
                                                      "googlenet", "vgg16", "vgg116", "vgg216",
                                                      "vgg316", "vgg416", "resnet18", "resnet50",
                                                      "resnext50_32x4d", "mobilenet_v2",
                                                      "efficientnet_b0"}));
}

TEST(Presets, UnknownNameListsKnownOnes) {
  try {
    preset_layers("resnet101", {});
    FAIL() << "expected GraphError";
  } catch (const GraphError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown model preset 'resnet101' (known: lenet, vgg-small, alexnet, overfeat, "
                 "googlenet, vgg16, vgg116, vgg216, vgg316, vgg416, resnet18, resnet50, "
                 "resnext50_32x4d, mobilenet_v2, efficientnet_b0)");
  }
}

TEST(Presets, RejectsNonPositiveOptions) {
  EXPECT_THROW(preset_layers("lenet", {Shape{1, 1, 0, 28}, 10}), GraphError);
  EXPECT_THROW(preset_layers("lenet", {Shape{1, 1, 28, 28}, 0}), GraphError);
}

TEST(Presets, ReferenceParameterCountsAt224) {
  EXPECT_EQ(imagenet_preset("alexnet").parameter_count(), 61'100'840);
  EXPECT_EQ(imagenet_preset("vgg16").parameter_count(), 138'357'544);
  EXPECT_EQ(imagenet_preset("resnet18").parameter_count(), 11'689'512);
  EXPECT_EQ(imagenet_preset("resnet50").parameter_count(), 25'557'032);
  // torchvision's counts (sum of p.numel() over model.parameters()).
  EXPECT_EQ(imagenet_preset("resnext50_32x4d").parameter_count(), 25'028'904);
  EXPECT_EQ(imagenet_preset("mobilenet_v2").parameter_count(), 3'504'872);
  EXPECT_EQ(imagenet_preset("efficientnet_b0").parameter_count(), 5'288'548);
}

// The same counts from the torchvision this machine has, at two class
// counts (at 224x224: on small inputs ResNeXt's stem conv is 3x3, not 7x7).
TEST(Presets, ParameterCountsEqualInstalledTorchvision) {
  if (const std::string why = test_support::test_python_missing("torch, torchvision");
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  const std::vector<std::string> names = {"resnext50_32x4d", "mobilenet_v2", "efficientnet_b0"};
  const std::vector<int64_t> class_counts = {1000, 10};
  // One interpreter for all: importing torch takes seconds.
  std::string script = "import torchvision\nfor name in ['resnext50_32x4d', 'mobilenet_v2', "
                       "'efficientnet_b0']:\n  for classes in [1000, 10]:\n    m = "
                       "getattr(torchvision.models, name)(num_classes=classes)\n    "
                       "print(sum(p.numel() for p in m.parameters()))\n";
  std::string output;
  ASSERT_EQ(test_support::run_command(test_support::test_python() + " -c \"" + script + "\"",
                                      &output),
            0)
      << output;
  std::istringstream lines(output);
  for (const std::string& name : names) {
    for (int64_t classes : class_counts) {
      SCOPED_TRACE(name + ", " + std::to_string(classes) + " classes");
      std::string torchvision_count;
      ASSERT_TRUE(std::getline(lines, torchvision_count)) << output;
      const Shape input{1, 3, 224, 224};
      const Graph g = Graph::build(preset_layers(name, {input, classes}), input);
      EXPECT_EQ(std::to_string(g.parameter_count()), torchvision_count);
    }
  }
}

TEST(Presets, LenetMatchesCaffe) {
  const Shape mnist{1, 1, 28, 28};
  const Graph g = Graph::build(preset_layers("lenet", {mnist, 10}), mnist);
  EXPECT_EQ(g.output_shape(g.find("pool2")), (Shape{1, 50, 4, 4}));
  EXPECT_EQ(count_layers(g, LayerType::kRelu), 1);
  // Caffe's LeNet on MNIST: 431,080 parameters.
  EXPECT_EQ(g.parameter_count(), 431'080);
}

TEST(Presets, ImageNetMapSizes) {
  EXPECT_EQ(imagenet_preset("alexnet").output_shape(imagenet_preset("alexnet").find("pool5")),
            (Shape{1, 256, 6, 6}));
  const Graph overfeat = imagenet_preset("overfeat", 231);
  EXPECT_EQ(overfeat.output_shape(overfeat.find("conv5")), (Shape{1, 1024, 12, 12}));
  EXPECT_EQ(overfeat.output_shape(overfeat.find("pool5")), (Shape{1, 1024, 6, 6}));
  const Graph vgg = imagenet_preset("vgg16");
  EXPECT_EQ(vgg.output_shape(vgg.find("pool5")), (Shape{1, 512, 7, 7}));
  const Graph resnet = imagenet_preset("resnet50");
  EXPECT_EQ(resnet.output_shape(resnet.find("maxpool")), (Shape{1, 64, 56, 56}));
  EXPECT_EQ(resnet.output_shape(resnet.find("layer4.2.relu")), (Shape{1, 2048, 7, 7}));
}

TEST(Presets, GooglenetFollowsThePaperTable) {
  const Graph g = imagenet_preset("googlenet");
  EXPECT_EQ(count_layers(g, LayerType::kConcat), 9);
  EXPECT_EQ(count_layers(g, LayerType::kBatchNorm), 0);
  EXPECT_EQ(g.output_shape(g.find("pool2")), (Shape{1, 192, 28, 28}));
  EXPECT_EQ(g.output_shape(g.find("inception3a.output")), (Shape{1, 256, 28, 28}));
  EXPECT_EQ(g.output_shape(g.find("inception3b.output")), (Shape{1, 480, 28, 28}));
  EXPECT_EQ(g.output_shape(g.find("inception4a.output")), (Shape{1, 512, 14, 14}));
  EXPECT_EQ(g.output_shape(g.find("inception4e.output")), (Shape{1, 832, 14, 14}));
  EXPECT_EQ(g.output_shape(g.find("inception5b.output")), (Shape{1, 1024, 7, 7}));
  EXPECT_EQ(g.output_shape(g.find("avgpool")), (Shape{1, 1024, 1, 1}));
}

TEST(Presets, ResnetJoins) {
  EXPECT_EQ(count_layers(imagenet_preset("resnet18"), LayerType::kAdd), 8);
  EXPECT_EQ(count_layers(imagenet_preset("resnet50"), LayerType::kAdd), 16);
  const Graph g = imagenet_preset("resnet18");
  // The 3 stage transitions project; the other blocks add the identity.
  EXPECT_EQ(g.find("layer1.0.downsample.conv"), -1);
  EXPECT_NE(g.find("layer2.0.downsample.conv"), -1);
  EXPECT_EQ(g.consumer_count(g.find("layer1.1.relu")), 2);
}

// ResNet-50's bottleneck now builds ResNeXt's too: its signature at 224 is
// still the one main had before (checkpoints and perf-DB rows key on it).
TEST(Presets, Resnet50IsUnchanged) {
  EXPECT_EQ(imagenet_preset("resnet50").signature(), "28647573b4a5a2be");
}

TEST(Presets, TorchvisionMobileNetsAndResNeXt) {
  const Graph mobilenet = imagenet_preset("mobilenet_v2");
  // Residual joins where a block keeps its shape: 1 + 2 + 3 + 2 + 2 blocks.
  EXPECT_EQ(count_layers(mobilenet, LayerType::kAdd), 10);
  EXPECT_EQ(count_layers(mobilenet, LayerType::kRelu6), 35);
  EXPECT_EQ(mobilenet.output_shape(mobilenet.find("features.18.2")), (Shape{1, 1280, 7, 7}));
  const LayerSpec& dw = mobilenet.layer(mobilenet.find("features.2.conv.1.0"));
  EXPECT_EQ(dw.groups, 96);
  EXPECT_EQ(mobilenet.layer(mobilenet.find("classifier.0")).dropout_p, 0.2f);

  const Graph efficientnet = imagenet_preset("efficientnet_b0");
  EXPECT_EQ(count_layers(efficientnet, LayerType::kAdd), 9);
  EXPECT_EQ(count_layers(efficientnet, LayerType::kMul), 16);  // one SE per MBConv
  EXPECT_EQ(count_layers(efficientnet, LayerType::kSigmoid), 16);
  EXPECT_EQ(efficientnet.output_shape(efficientnet.find("features.8.2")), (Shape{1, 1280, 7, 7}));
  // The first stage's SE squeezes a quarter of the block's input: 32 / 4.
  EXPECT_EQ(efficientnet.output_shape(efficientnet.find("features.1.0.block.1.fc1")),
            (Shape{1, 8, 1, 1}));
  EXPECT_EQ(efficientnet.layer(efficientnet.find("features.3.0.block.1.0")).kernel_h, 5);

  const Graph resnext = imagenet_preset("resnext50_32x4d");
  EXPECT_EQ(count_layers(resnext, LayerType::kAdd), 16);
  const LayerSpec& conv2 = resnext.layer(resnext.find("layer1.0.conv2"));
  EXPECT_EQ(conv2.groups, 32);
  EXPECT_EQ(conv2.out, 128);  // 64 planes * 4 / 64 * 32 groups
  EXPECT_EQ(resnext.output_shape(resnext.find("layer4.2.relu")), (Shape{1, 2048, 7, 7}));
}

TEST(Presets, SmallInputStems) {
  const Shape cifar{1, 3, 32, 32};
  const Graph resnet = Graph::build(preset_layers("resnet18", {cifar, 10}), cifar);
  EXPECT_EQ(resnet.find("maxpool"), -1);
  EXPECT_EQ(resnet.output_shape(resnet.find("layer1.1.relu")), (Shape{1, 64, 32, 32}));
  EXPECT_EQ(resnet.output_shape(resnet.find("layer4.1.relu")), (Shape{1, 512, 4, 4}));
  const Shape mnist{1, 1, 28, 28};
  const Graph vgg = Graph::build(preset_layers("vgg16", {mnist, 10}), mnist);
  // 28 -> 14 -> 7 -> 3 -> 1: the fifth pool would not fit and is left out.
  EXPECT_EQ(vgg.find("pool5"), -1);
  EXPECT_EQ(vgg.output_shape(vgg.find("relu5_3")), (Shape{1, 512, 1, 1}));
  // The 3x3 stems of the mobile nets at stride 1: 32 / 16 = 2.
  const Graph mobilenet = Graph::build(preset_layers("mobilenet_v2", {cifar, 10}), cifar);
  EXPECT_EQ(mobilenet.layer(mobilenet.find("features.0.0")).stride_h, 1);
  EXPECT_EQ(mobilenet.output_shape(mobilenet.find("features.18.2")), (Shape{1, 1280, 2, 2}));
  const Graph efficientnet = Graph::build(preset_layers("efficientnet_b0", {cifar, 10}), cifar);
  EXPECT_EQ(efficientnet.output_shape(efficientnet.find("features.8.2")), (Shape{1, 1280, 2, 2}));
  const Graph resnext = Graph::build(preset_layers("resnext50_32x4d", {cifar, 10}), cifar);
  EXPECT_EQ(resnext.find("maxpool"), -1);
  EXPECT_EQ(resnext.output_shape(resnext.find("layer4.2.relu")), (Shape{1, 2048, 4, 4}));
}

TEST(Presets, VeryDeepVggsHaveTheirNamedDepth) {
  for (int hundreds = 0; hundreds <= 4; ++hundreds) {
    const std::string name = "vgg" + std::to_string(hundreds * 100 + 16);
    SCOPED_TRACE(name);
    const Shape cifar{1, 3, 32, 32};
    const Graph g = Graph::build(preset_layers(name, {cifar, 10}), cifar);
    const int convs = count_layers(g, LayerType::kConv);
    EXPECT_EQ(convs, 13 + 100 * hundreds);
    EXPECT_EQ(convs + count_layers(g, LayerType::kFc), 16 + 100 * hundreds);
    // 20 extra convs per group, with the group's width.
    EXPECT_EQ(g.output_shape(g.find("conv1_" + std::to_string(2 + 20 * hundreds))).c, 64);
    EXPECT_EQ(g.find("conv1_" + std::to_string(3 + 20 * hundreds)), -1);
    EXPECT_EQ(g.output_shape(g.find("conv5_" + std::to_string(3 + 20 * hundreds))).c, 512);
  }
}

TEST(Presets, SignaturesDifferBetweenPresetsAndInputs) {
  std::set<std::string> seen;
  for (const std::string& name : preset_names()) {
    for (const Shape& input : {Shape{1, 1, 28, 28}, Shape{1, 3, 32, 32}}) {
      const Graph g = Graph::build(preset_layers(name, {input, 10}), input);
      EXPECT_TRUE(seen.insert(g.signature()).second) << name << " " << input.str();
    }
  }
}

}  // namespace
}  // namespace vtrain::worker
