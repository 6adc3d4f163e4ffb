// kiln-run: runs a module file; also the runtime that kilnc turns into training executables.
#include "runtime/cli.h"

int main(int argc, char** argv) { return kiln::run_main(argc, argv); }
