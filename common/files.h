// Whole-file writes that never leave a partial file behind.
#pragma once

#include <string>

namespace vtrain::common {

// Writes `text` to a temporary file beside `path` and renames it over `path`:
// a failed write leaves the old file (or none) in place. Throws InputError
// naming `what` ("plan", "Pareto fronts") and the path.
void write_file_whole(const std::string& path, const std::string& text, const std::string& what);

}  // namespace vtrain::common
