// kiln-opt: runs kiln passes (and upstream ones) on .mlir files, like mlir-opt.
#include "Kiln/KilnDialect.h"
#include "compiler/pipeline.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "passes/Passes.h"

#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  registry.insert<kiln::KilnDialect, mlir::func::FuncDialect>();
  mlir::registerTransformsPasses();
  kiln::registerKilnPasses();
  kiln::registerKilnPipelines();
  // A pass error names the op at fault by its location; MLIR would also print the whole module
  // below it. Unless asked for (--mlir-print-op-on-diagnostic), it does not.
  std::vector<char*> args(argv, argv + argc);
  bool asked = false;
  for (int i = 1; i < argc; ++i) asked |= std::strstr(argv[i], "mlir-print-op-on-diagnostic") != nullptr;
  static char quiet[] = "--mlir-print-op-on-diagnostic=false";
  if (!asked) args.insert(args.begin() + 1, quiet);
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(int(args.size()), args.data(), "Kiln optimizer driver\n", registry));
}
