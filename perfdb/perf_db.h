// The performance database: one SQLite file that every rank of a cluster
// shares (often over NFS). Benchmarks record per-kernel times (for the
// micro-batch / workspace optimiser) and whole-step times (for the balancer);
// the balancer and the what-if tools read them back. perfdb/README.md has the
// tables and how to inspect a file with the sqlite3 shell.
//
// Sharing. Many processes on many hosts may open the same file at once: every
// write is one short transaction that takes the write lock up front, waits
// for a busy lock and then retries the whole transaction with backoff, and
// upserts rows on their natural key, so a retried or repeated write never
// duplicates a row and concurrent writers never lose one. The file uses a
// rollback journal (never WAL, which does not work over NFS); its directory
// must be on a file system with working POSIX locks.
//
// Thread-safety. A PerfDb is not thread-safe: use one object per thread (each
// holds its own SQLite connection). Any number of objects in any number of
// threads and processes may use the same file. Do not carry an open PerfDb
// across fork(); open a new one in the child.
//
// Errors. Failures throw PerfDbError naming the file and the operation
// ("perf DB FILE: OPERATION: what went wrong"). Expected misses are not
// errors: a lookup returns std::nullopt or an empty vector.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/activation_bytes.h"
#include "common/compute_settings.h"
#include "common/conv_kind.h"
#include "common/device_label.h"

namespace vtrain::perfdb {

class PerfDbError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The schema version this code creates and writes. Opening a file with an
// older version upgrades it in place; a newer version is an error.
inline constexpr int kSchemaVersion = 9;

// ------------------------------------------------------------------ records

// A device as the backend describes it. Identity is (name, backend,
// library_version, threads, host): a new library version or thread count is a
// new device, because its measurements differ. memory_bytes is an attribute,
// updated when the same device is registered again.
struct Device {
  std::string name;             // CPU model name or GPU name, e.g. "NVIDIA H200"
  std::string backend;          // "cpu" or "cuda"
  uint64_t memory_bytes = 0;    // device memory capacity the backend serves
  std::string library_version;  // e.g. "oneDNN 3.0.0" or "cuDNN 9.1.0, kernels r2"
  int threads = 1;              // CPU threads used (1 for a GPU)
  std::string host;             // hostname
};

// The label that tells devices apart where people read or pick one (`vtrain
// balance --devices`, plans, `vtrain db stats`): a CPU device's name with
// its thread count, "AMD EPYC 7763 (2 threads)" as text, because CPU
// devices that differ only in device.threads share a name and their times
// differ; a GPU's name alone. Devices on other hosts or with another
// library version share a label: they are the same hardware.
common::DeviceLabel device_label(const Device& device);

struct DeviceId {
  int64_t value = 0;
  friend bool operator==(DeviceId, DeviceId) = default;
};

struct DeviceRecord {
  DeviceId id;
  Device device;
};

// A convolution's kernel; the file stores common::conv_kind_name()
// ("Forward", "BackwardData", "BackwardFilter").
using KernelKind = common::ConvKind;

// One convolution kernel (groups 1, dilation 1). Two signatures name the same
// kernel when every field is equal.
struct KernelSignature {
  KernelKind kind = KernelKind::kForward;
  int64_t n = 1, c = 1, h = 1, w = 1;  // input: (mini-)batch the layer runs with, channels, height, width
  int64_t k = 1, r = 1, s = 1;         // filters: output channels, height, width
  int64_t pad_h = 0, pad_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  // Channel groups (worker::ConvProblem::groups): a depthwise c->c conv and
  // a dense one on the same input are different kernels.
  int64_t groups = 1;
  std::string dtype = "f32";           // element type
  // The activation layouts the kernel ran on: the forward convolution's
  // input x and output y, by worker::layout_name ("plain", "nChw16c", ...).
  std::string input_layout = "plain";
  std::string output_layout = "plain";

  friend bool operator==(const KernelSignature&, const KernelSignature&) = default;
};

// One algorithm of one kernel at one micro-batch size on one device.
struct KernelMeasurement {
  std::string algorithm;               // the backend's stable algorithm name
  int64_t micro_batch = 1;             // images per call, 1..n
  double time_ms = 0;                  // median time of one call
  // Interquartile range (75th minus 25th percentile) of the timed calls.
  // nullopt for rows written before schema 2, which did not store it.
  std::optional<double> time_iqr_ms;
  uint64_t workspace_bytes = 0;        // scratch memory the call needs
  int64_t measured_at = 0;             // seconds since the Unix epoch; 0 when recording = now
};

// A kernel measurement together with the kernel it measures (for recording).
struct KernelSample {
  KernelSignature kernel;
  KernelMeasurement measurement;
};

// What a model's step and layer times are keyed on: the architecture and
// how it was computed, each a column of its own (model, then one per
// setting, common::setting_texts): a model measured in bf16 or with
// another layout is another row.
struct ModelKey {
  std::string signature;              // model signature (stable text naming layers and
                                      // shapes, worker::Graph::signature()), not empty
  common::ComputeSettings settings{};  // precision, layout and fusion it was computed with
  friend bool operator==(const ModelKey&, const ModelKey&) = default;
};

// The key as people read it: "<signature> (<common::describe(settings)>)".
std::string describe_model(const ModelKey& model);

// Forward plus backward of a whole model on one device at one batch size.
// Key: (device, model, batch, memory_policy, policy_capacity_bytes,
// workspace_plan).
struct StepMeasurement {
  ModelKey model;               // the model and how it was computed
  int64_t batch = 1;            // per-rank batch
  std::string memory_policy;    // memory.policy's name alone, e.g. "none", "conv", "dyn"
  uint64_t policy_capacity_bytes = 0;  // the device capacity the policy planned for where
                                       // its plan depends on it (memory::plans_for_capacity:
                                       // "dyn", "auto", ...); 0 for the other policies
  std::string workspace_plan;   // signature of the workspace/micro-batch plan; "" = none
  double time_ms = 0;           // upload (as training makes it: copied ahead where it is),
                                // forward, backward, update (no exchange), ms
  uint64_t peak_device_bytes = 0;
  int64_t measured_at = 0;      // seconds since the Unix epoch; 0 when recording = now
  // The memory plan the step ran; nullopt for rows recorded without one
  // (before schema version 4).
  std::optional<common::ActivationBytes> activations;
};

// The memory stream's copy bandwidth of a device, one way: what the timed
// memory simulator costs offloads and prefetches with. Key: (device,
// direction).
enum class CopyDirection {
  kToHost,    // device -> pinned host memory (an offload)
  kToDevice,  // pinned host memory -> device (a prefetch)
};
// As stored: "to_host", "to_device".
const char* copy_direction_name(CopyDirection direction);

struct CopyBandwidthMeasurement {
  CopyDirection direction = CopyDirection::kToHost;
  uint64_t bytes = 0;           // bytes per timed copy, >= 1
  double bytes_per_second = 0;  // median over the timed copies, > 0
  int64_t measured_at = 0;      // seconds since the Unix epoch; 0 when recording = now
  // The share of a copy's time the compute stream loses while both run, in
  // [0, 1] (memory::StepCosts::copy_compute_share); nullopt in rows recorded
  // before schema version 6, which a profile then measures again.
  std::optional<double> compute_share;
};

// layer_index of the loss (softmax cross-entropy on the logits) among a
// model's layer measurements: forward_ms is its time, backward_ms 0.
inline constexpr int64_t kLossLayer = -1;
// layer_index of a step's time outside its layer calls and loss (the
// engine's memory operations and pool): forward_ms is that time, backward_ms
// 0. Recorded when the layers were timed inside training steps; a model's
// rows without it read as 0.
inline constexpr int64_t kOutsideCallsLayer = -2;

// One layer's forward and backward call of a model at one per-rank batch on
// one device: the timed memory simulator's per-layer costs. Key: (device,
// model, batch, layer_index).
struct LayerMeasurement {
  int64_t layer_index = 0;  // graph index (0: the data), kLossLayer or kOutsideCallsLayer
  std::string layer_name;   // the model's name for it ("loss", "outside layer calls")
  double forward_ms = 0;    // median, training mode
  double backward_ms = 0;   // median
  int64_t measured_at = 0;  // seconds since the Unix epoch; 0 when recording = now
};

// What an input rate was measured for: a host's decoding workers turning
// one dataset into batches through one transform. Every field is part of
// the key (host, workers, dataset_kind, dataset, channels, height, width,
// transform): a rate measured with other workers or another transform is
// another row, so a change of either is measured afresh.
struct InputKey {
  std::string host;          // the node whose cores read and decode
  int workers = 1;           // decoding workers (threads) the rate was measured with, >= 1
  std::string dataset_kind;  // data.kind, e.g. "idx", "cifar10", "synthetic", "imagefolder"
  std::string dataset;       // which dataset of that kind: its training file or folder
                             // ("" for generated data)
  int64_t channels = 1;      // the network's input [C, H, W] the samples become, each >= 1
  int64_t height = 1;
  int64_t width = 1;
  std::string transform;     // the training transform's signature (InputRateSource::transform)
  friend bool operator==(const InputKey&, const InputKey&) = default;
};

// Images per second a host's input delivers for one key: the rate the
// batch split prices a rank's input with (balancer::DeviceProfile::input_rate).
struct InputRateMeasurement {
  InputKey key;
  double images_per_second = 0;  // > 0, finite
  int host_cores = 1;            // cores of the host when measured, >= 1 (what a what-if
                                 // with more workers scales up to)
  int64_t batch = 1;             // images per timed batch, >= 1
  int64_t measured_at = 0;       // seconds since the Unix epoch; 0 when recording = now
};

// ------------------------------------------------------------------ queries

struct DeviceStats {
  DeviceRecord device;
  int64_t kernel_measurements = 0;
  int64_t step_measurements = 0;
  int64_t layer_measurements = 0;
};

struct Stats {
  int schema_version = 0;
  int64_t devices = 0;              // row counts per table
  int64_t kernels = 0;
  int64_t kernel_measurements = 0;
  int64_t step_measurements = 0;
  int64_t copy_bandwidths = 0;
  int64_t layer_measurements = 0;
  int64_t input_rates = 0;
  std::vector<DeviceStats> per_device;  // ordered by device id
};

enum class Table {
  kDevices,
  kKernels,
  kKernelMeasurements,
  kStepMeasurements,
  kCopyBandwidth,
  kLayerMeasurements,
  kInputRates,
};
// Every table, in the order above.
inline constexpr Table kTables[] = {Table::kDevices,          Table::kKernels,
                                    Table::kKernelMeasurements, Table::kStepMeasurements,
                                    Table::kCopyBandwidth,    Table::kLayerMeasurements,
                                    Table::kInputRates};
// The SQL table name: "devices", "kernels", "kernel_measurements",
// "step_measurements", "copy_bandwidth", "layer_measurements", "input_rates".
const char* table_name(Table table);
// The table with that SQL name; nullopt when there is none.
std::optional<Table> table_from_name(std::string_view name);
// Every table's name, "devices, kernels, ...", for messages.
std::string table_names();

enum class ExportFormat {
  kCsv,        // a header line, then one RFC 4180 line per row
  kJsonLines,  // one flat JSON object per row; NULL -> null
};

// ---------------------------------------------------------------- the database

enum class OpenMode {
  kReadWrite,  // create the file if missing, create or upgrade the schema (profiling)
  kReadOnly,   // an existing, current perf DB, never written (offline planning)
};

struct PerfDbOptions {
  // kReadOnly opens with SQLITE_OPEN_READONLY: the file must exist and hold
  // a perf DB of kSchemaVersion; nothing is created, migrated or switched to
  // another journal mode (a WAL file stays WAL), and writes throw.
  OpenMode mode = OpenMode::kReadWrite;
  // How long one statement waits, polling at short random intervals, for a
  // lock another process holds before it reports busy.
  std::chrono::milliseconds busy_timeout{5000};
  // Whole-transaction attempts on a busy file before PerfDbError. With the
  // defaults a write waits about a minute for a busy file before failing:
  // benchmark results are expensive, so waiting beats losing them.
  int max_attempts = 12;
  // Sleep between attempts: random in [0, d] where d doubles from
  // backoff_initial up to backoff_max (the randomness keeps writers that
  // collided from colliding again).
  std::chrono::milliseconds backoff_initial{10};
  std::chrono::milliseconds backoff_max{1000};
};

class PerfDb {
 public:
  // Opens `path`, creating the file if it does not exist; ":memory:" opens a
  // private in-memory database (for tests). An existing file is checked
  // read-only first (SQLite header, PRAGMA quick_check, our schema_version
  // table) and is upgraded to kSchemaVersion in one transaction. Throws
  // PerfDbError, leaving the file's bytes untouched, when the file is not a
  // valid perf DB (garbage, truncated, or an SQLite file of someone else's)
  // or has a newer schema than this code knows. An SQLite file with no
  // tables at all counts as empty and is initialised. A directory is an
  // error saying so. With OpenMode::kReadOnly (see PerfDbOptions) a missing
  // file ("no such file"), an empty one, an older schema and a hot journal
  // left by a crashed writer are errors too, and the file is never written.
  explicit PerfDb(const std::string& path, const PerfDbOptions& options = {});
  ~PerfDb();
  PerfDb(PerfDb&&) noexcept;
  PerfDb& operator=(PerfDb&&) noexcept;
  PerfDb(const PerfDb&) = delete;
  PerfDb& operator=(const PerfDb&) = delete;

  const std::string& path() const;

  // Registers a device (or updates memory_bytes of a known one) and returns
  // its id. Ids are stable for the life of the file.
  DeviceId upsert_device(const Device& device);
  // The id of the device with `device`'s identity (name, backend, library
  // version, threads, host; memory_bytes is not part of it), or nullopt.
  // Writes nothing (for read-only files).
  std::optional<DeviceId> find_device(const Device& device);

  // Records all samples in one transaction: each kernel is registered if new,
  // and each measurement replaces any earlier one with the same (device,
  // kernel, algorithm, micro_batch). Throws for an unknown device or an
  // invalid field (e.g. micro_batch outside 1..n, negative or non-finite time),
  // recording nothing.
  void record_kernel_measurements(DeviceId device, std::span<const KernelSample> samples);

  // Records all steps in one transaction; each replaces any earlier one with
  // the same (device, model, batch, memory_policy, policy_capacity_bytes,
  // workspace_plan).
  void record_step_measurements(DeviceId device, std::span<const StepMeasurement> steps);

  // Records the device's copy bandwidth (one or both directions) in one
  // transaction; each replaces the device's earlier one for its direction.
  // Throws for an unknown device, an invalid field or a direction given
  // twice, recording nothing.
  void record_copy_bandwidth(DeviceId device,
                             std::span<const CopyBandwidthMeasurement> measurements);

  // The device's copy bandwidth one way; nullopt when it was never recorded.
  std::optional<CopyBandwidthMeasurement> find_copy_bandwidth(DeviceId device,
                                                              CopyDirection direction);

  // Records layers of `model` at per-rank `batch` in one transaction (all
  // or none); each replaces an earlier one with the same (device, model,
  // batch, layer_index). Throws for an unknown device, an empty model, a
  // batch below 1, an invalid field or a layer_index given twice, recording
  // nothing.
  void record_layer_measurements(DeviceId device, const ModelKey& model, int64_t batch,
                                 std::span<const LayerMeasurement> layers);

  // The layers recorded for (device, model, batch), ordered by layer_index
  // (the loss first); empty when there is none.
  std::vector<LayerMeasurement> layer_measurements(DeviceId device, const ModelKey& model,
                                                   int64_t batch);

  // Records an input rate; it replaces any earlier one with the same key.
  // Throws for an invalid field (an empty host, dataset_kind or transform,
  // workers, cores, batch or a dimension below 1, a rate not finite and
  // > 0), recording nothing.
  void record_input_rate(const InputRateMeasurement& rate);
  // The rate recorded for exactly `key`; nullopt when there is none.
  std::optional<InputRateMeasurement> find_input_rate(const InputKey& key);
  // Every rate recorded on `host`, ordered by id; empty when there is none.
  std::vector<InputRateMeasurement> input_rates(std::string_view host);

  // One measurement; nullopt when it was never recorded.
  std::optional<KernelMeasurement> find_kernel_measurement(DeviceId device,
                                                           const KernelSignature& kernel,
                                                           std::string_view algorithm,
                                                           int64_t micro_batch);

  // Every measurement of one kernel on one device, ordered by (algorithm,
  // micro_batch); empty when there is none.
  std::vector<KernelMeasurement> kernel_measurements(DeviceId device, const KernelSignature& kernel);

  // Every step of a model under a memory policy (planned for
  // `policy_capacity_bytes`, 0 for a policy whose plan does not depend on the
  // capacity) on one device, ordered by (batch, workspace_plan); empty when
  // there is none.
  std::vector<StepMeasurement> step_measurements(DeviceId device, const ModelKey& model,
                                                 std::string_view memory_policy,
                                                 uint64_t policy_capacity_bytes = 0);

  // All devices, ordered by id.
  std::vector<DeviceRecord> devices();

  // Devices with exactly this name (one per host / library version / thread
  // count), ordered by id; empty when there is none.
  std::vector<DeviceRecord> find_devices(std::string_view name);

  Stats stats();

  // Writes every row of `table`, ordered by id, with the columns as stored.
  // Throws if the stream fails.
  void export_table(Table table, ExportFormat format, std::ostream& out);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vtrain::perfdb
