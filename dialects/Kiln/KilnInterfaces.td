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
    such as token ids or a runtime scalar). The autodiff pass walks a function backwards calling
    this and sums the gradients of values with several uses. It refuses a null gradient for an
    operand computed from a parameter: that parameter's gradient would be silently incomplete.
  }];
  let cppNamespace = "::kiln";
  let methods = [
    InterfaceMethod<
      /*desc=*/"Build the gradients of the operands from the gradients of the results.",
      /*retTy=*/"::llvm::SmallVector<::mlir::Value>",
      /*methodName=*/"buildVJP",
      /*args=*/(ins "::mlir::OpBuilder &":$builder,
                    "::llvm::ArrayRef<::mlir::Value>":$resultGrads)>,
    InterfaceMethod<
      /*desc=*/[{Whether result `index` is a constant of the backward pass: a statistic kept for
        the gradient ops (a layer norm's mean and rstd, a log-sum-exp) whose own gradient
        `buildVJP` ignores. kiln-autodiff refuses a forward pass in which such a result, computed
        from a parameter, reaches the loss: its share of the gradient would be dropped.}],
      /*retTy=*/"bool",
      /*methodName=*/"isConstantResult",
      /*args=*/(ins "unsigned":$index),
      /*methodBody=*/[{}],
      /*defaultImplementation=*/[{ return false; }]>
  ];
}

#endif // KILN_INTERFACES_TD
