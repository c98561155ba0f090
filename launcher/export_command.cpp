// `vtrain export`: a checkpoint's weights in the config's graph, written in
// the format asked for.
#include "launcher/export_command.h"

#include <cstdio>
#include <stdexcept>

#include "common/text.h"
#include "model_io/onnx.h"
#include "model_io/weights_export.h"
#include "worker/engine/parameter_layout.h"
#include "worker/train/checkpoint.h"

namespace vtrain::launcher {

int run_export(const CliArgs& cli, const worker::Graph& graph, const worker::ChannelStats& norm,
               const std::string& preset) {
  const std::string path = worker::checkpoint_at(cli.checkpoint);
  worker::Checkpoint ckpt = worker::load_checkpoint(path);
  worker::check_checkpoint_matches(ckpt, path, graph.signature(), graph.parameter_count(),
                                   worker::buffer_count(graph));
  if (cli.format == "safetensors") {
    const model_io::ExportSummary written =
        model_io::export_safetensors(graph, preset, ckpt, cli.out);
    std::printf("exported %s as safetensors (%lld tensors, %s, %s names) to %s\n", path.c_str(),
                static_cast<long long>(written.tensors), common::format_bytes(written.bytes).c_str(),
                written.torchvision ? "torchvision" : "vtrain", cli.out.c_str());
    return kExitOk;
  }
  // parse_cli admits only kExportFormats.
  if (cli.format != "onnx") throw std::logic_error("export: format '" + cli.format + "' unhandled");
  const worker::FlatWeights weights{std::move(ckpt.parameters), std::move(ckpt.buffers)};
  model_io::write_onnx(cli.out, graph, weights, {norm.mean, norm.stddev});
  std::printf("exported %s (step %lld) as ONNX opset %lld to %s\n", path.c_str(),
              static_cast<long long>(ckpt.step), static_cast<long long>(model_io::kOnnxOpset),
              cli.out.c_str());
  return kExitOk;
}

}  // namespace vtrain::launcher
