#include "Kiln/KilnDialect.h"

using namespace mlir;
using namespace kiln;

#include "Kiln/KilnDialect.cpp.inc"
#include "Kiln/KilnInterfaces.cpp.inc"

void KilnDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "Kiln/KilnOps.cpp.inc"
      >();
}
