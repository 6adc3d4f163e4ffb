//===- KilnInterfaces.td - autodiff op interface -------------------------*- tablegen -*-===//
#ifndef KILN_INTERFACES_TD
#define KILN_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Kiln_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let description = [{
    An op that knows its vector-Jacobian product. Given the gradients of the loss with respect
    to the op's results (a null Value where a result does not reach the loss), `buildVJP`
    builds, at the builder's insertion point, the ops that compute the gradient with respect to
    each operand, and returns one Value per operand (null where the operand takes no gradient,
    such as token ids). The autodiff pass walks a function backwards calling this and sums the
    gradients of values with several uses.
  }];
  let cppNamespace = "::kiln";
  let methods = [
    InterfaceMethod<
      /*desc=*/"Build the gradients of the operands from the gradients of the results.",
      /*retTy=*/"::llvm::SmallVector<::mlir::Value>",
      /*methodName=*/"buildVJP",
      /*args=*/(ins "::mlir::OpBuilder &":$builder,
                    "::llvm::ArrayRef<::mlir::Value>":$resultGrads)>
  ];
}

#endif // KILN_INTERFACES_TD
