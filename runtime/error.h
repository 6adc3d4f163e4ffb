// The one exception type of the runtime: a single line that names the file, the place and the
// problem ("data/train_000.bin: header: magic 1234 is not 20240520"). Tools print it and exit 1.
#pragma once
#include <stdexcept>
#include <string>

namespace kiln {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace kiln
