#include "launcher/db_command.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/text.h"
#include "perfdb/perf_db.h"

namespace vtrain::launcher {

int run_db(const CliArgs& cli) {
  if (!std::filesystem::exists(cli.db)) {
    throw std::runtime_error("perf DB " + cli.db + " does not exist (create it with vtrain profile)");
  }
  // stats and export only read: like balance, they neither initialise an
  // empty file, nor switch a WAL file to a rollback journal, nor roll back
  // a crashed writer's journal (vtrain profile does).
  perfdb::PerfDb db(cli.db, {.mode = perfdb::OpenMode::kReadOnly});
  if (cli.db_action == "export") {
    const auto table = perfdb::table_from_name(cli.table);
    if (!table) {
      throw UsageError("unknown table '" + cli.table + "' (known: " + perfdb::table_names() + ")");
    }
    db.export_table(*table,
                    cli.format == "jsonl" ? perfdb::ExportFormat::kJsonLines : perfdb::ExportFormat::kCsv,
                    std::cout);
    return kExitOk;
  }
  const perfdb::Stats st = db.stats();
  std::printf("perf DB %s (schema version %d)\n", cli.db.c_str(), st.schema_version);
  std::printf("  %lld devices, %lld kernels, %lld kernel measurements, %lld step measurements, "
              "%lld copy bandwidths, %lld layer measurements\n",
              static_cast<long long>(st.devices), static_cast<long long>(st.kernels),
              static_cast<long long>(st.kernel_measurements),
              static_cast<long long>(st.step_measurements),
              static_cast<long long>(st.copy_bandwidths),
              static_cast<long long>(st.layer_measurements));
  for (const perfdb::DeviceStats& d : st.per_device) {
    // The label is the name `vtrain balance --devices` takes.
    std::printf("  device %lld: '%s' (%s, %s, %d threads, host %s): %lld kernel, %lld step, "
                "%lld layer measurements\n",
                static_cast<long long>(d.device.id.value),
                perfdb::device_label(d.device.device).text().c_str(),
                d.device.device.backend.c_str(), d.device.device.library_version.c_str(),
                d.device.device.threads, d.device.device.host.c_str(),
                static_cast<long long>(d.kernel_measurements),
                static_cast<long long>(d.step_measurements),
                static_cast<long long>(d.layer_measurements));
  }
  return kExitOk;
}

}  // namespace vtrain::launcher
