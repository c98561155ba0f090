// Whole-file reads of the text inputs a user names (a config, a plan), with
// a size limit: a path to /dev/zero, /dev/urandom or a FIFO ends at once
// with an error instead of filling memory or waiting forever.
#pragma once

#include <cstdint>
#include <string>

namespace vtrain::common {

// The contents of `path`, at most `limit` bytes. A regular file's size is
// checked before reading; anything else (a device, a pipe such as bash's
// <(...), a FIFO) is read up to `limit` + 1 bytes. A FIFO with no writer
// reads as empty instead of blocking the open. Throws InputError naming
// `what` ("config", "plan") and the path: "cannot open config PATH: No such
// file or directory", "... is a directory", "cannot read plan PATH: larger
// than 64 MiB, the most a plan may be (is it a plan?)".
std::string read_text_file(const std::string& path, const std::string& what, uint64_t limit);

}  // namespace vtrain::common
