// kiln-opt: runs kiln passes (and upstream ones) on .mlir files, like mlir-opt.
#include "Kiln/KilnDialect.h"
#include "compiler/pipeline.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "passes/Passes.h"

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  registry.insert<kiln::KilnDialect, mlir::func::FuncDialect>();
  mlir::registerTransformsPasses();
  kiln::registerKilnPasses();
  kiln::registerKilnPipelines();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "Kiln optimizer driver\n", registry));
}
