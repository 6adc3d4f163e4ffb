// The command line of a training executable (`./gpt2 train ...`) and of
// `kiln-run MODULE train ...`: the same code, with or without an embedded module.
#pragma once

namespace kiln {
int run_main(int argc, char** argv);
}
