// kiln-run-emulated: kiln-run whose cuda modules run on the CUDA emulation (emulated_device.h),
// for end-to-end tests of the runtime's GPU path without a GPU.
#include "emulated_device.h"
#include "runtime/cli.h"

int main(int argc, char** argv) {
  kiln::set_device_factory(kiln::make_emulated_device, /*host_addressable=*/true);
  return kiln::run_main(argc, argv);
}
