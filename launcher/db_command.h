// `vtrain db stats | export`: the perf DB's row counts per table and device,
// or one table as CSV or JSON lines on stdout.
#pragma once

#include "launcher/cli.h"

namespace vtrain::launcher {

// Throws std::runtime_error for a missing file, UsageError for an unknown
// table (listing the known ones), PerfDbError for a file that is not a perf
// DB. Returns the exit code.
int run_db(const CliArgs& cli);

}  // namespace vtrain::launcher
