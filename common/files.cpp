#include "common/files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/input_error.h"

namespace vtrain::common {

namespace fs = std::filesystem;

void write_file_whole(const std::string& path, const std::string& text, const std::string& what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw InputError("cannot write " + what + " " + tmp + ": " + std::strerror(errno));
    out << text;
    out.flush();
    if (!out) {
      std::error_code ignored;
      fs::remove(tmp, ignored);
      throw InputError("cannot write " + what + " " + tmp + ": " + std::strerror(errno));
    }
  }
  std::error_code error;
  fs::rename(tmp, path, error);
  if (error) {
    fs::remove(tmp, error);
    throw InputError("cannot write " + what + " " + path + ": " + error.message());
  }
}

}  // namespace vtrain::common
